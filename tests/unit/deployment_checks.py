"""Checks shared by the tests of docker-compose.yml and of the Kubernetes manifests in docs/."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import os
import re
from collections.abc import Iterator, Mapping, Sequence

import pytest

from outbox import settings
from outbox.cli import build_parser

#: The `outbox` commands that run as long-lived daemons.
DAEMONS = frozenset({"producer", "consumer", "handler"})
#: The settings without which each command refuses to start (attribute of the parsed args).
REQUIRED = {
    "migrate": ("database_url",),
    "producer": ("database_url", "kafka_bootstrap"),
    "consumer": ("database_url", "kafka_bootstrap", "group"),
    "handler": ("database_url",),
}


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Run with exactly `values` as the registered variables (the others unset)."""
    names = {v.name for v in settings.ENVIRONMENT} | {k for k in os.environ if "OUTBOX_" in k}
    saved = {name: os.environ[name] for name in names if name in os.environ}
    try:
        for name in names:
            os.environ.pop(name, None)
        os.environ.update(values)
        yield
    finally:
        for name in names | set(values):
            os.environ.pop(name, None)
        os.environ.update(saved)


def parse_outbox(argv: Sequence[str], env: Mapping[str, str], where: str) -> argparse.Namespace:
    """`outbox ARGV` parsed as the container would, with its environment; fails the test on a
    usage error with argparse's message."""
    stderr = io.StringIO()
    with environment(env), contextlib.redirect_stderr(stderr):
        try:
            args = build_parser().parse_args(list(argv))
            if isinstance(getattr(args, "database_url", None), list):
                # A command of several databases (`add_databases`): its first database's URL,
                # from the flags, the file or OUTBOX_DATABASE_URL, as `databases_of` finds it.
                args.database_url = _first_database_url(args)
            return args
        except SystemExit as exc:
            lines = stderr.getvalue().strip().splitlines() or [""]
            pytest.fail(
                f"{where}: `outbox {' '.join(argv)}` does not parse (exit {exc.code}): {lines[-1]}",
                pytrace=False,
            )
    raise AssertionError("unreachable")  # pragma: no cover


def _first_database_url(args: argparse.Namespace) -> str | None:
    from outbox.cli.arguments import databases_of
    from outbox.core.errors import ConfigurationError

    try:
        return databases_of(args)[0].url
    except ConfigurationError:
        return None


def check_required(args: argparse.Namespace, where: str) -> None:
    """The settings the command needs are there, from a flag or from the environment."""
    for attribute in REQUIRED.get(args.command, ()):
        assert getattr(args, attribute, None), (
            f"{where}: `outbox {args.command}` has no {attribute} (flag or OUTBOX_* variable)"
        )


def check_variables(env: Mapping[str, str], where: str) -> None:
    """Every OUTBOX_* variable set is one the package reads."""
    unknown = sorted(
        name for name in env if name.startswith("OUTBOX_") and not settings.is_read(name)
    )
    assert not unknown, f"{where}: outbox reads no such variable: {unknown}"


def check_handlers(path: str, where: str) -> list[str]:
    """MODULE:ATTRIBUTE imports and is a Handlers registry; its topics."""
    from outbox.core.errors import ConfigurationError
    from outbox.daemons.handler import load_handlers

    try:
        return load_handlers(path).topics
    except ConfigurationError as exc:
        pytest.fail(f"{where}: {exc}", pytrace=False)


def check_python_module(argv: Sequence[str], where: str) -> None:
    """`python -m MODULE ...` names a module that can be found."""
    assert list(argv[:2]) == ["python", "-m"], f"{where}: unexpected command {argv}"
    spec = importlib.util.find_spec(argv[2])
    assert spec is not None, f"{where}: no module {argv[2]}"
    # `python -m package` runs package.__main__
    importlib.import_module(argv[2] + (".__main__" if spec.submodule_search_locations else ""))


# -- secrets stay off command lines ------------------------------------------------------------

#: What makes a setting's key or a flag's name look secret: the words outbox masks
#: (`outbox.core.redact`), a token, and every SASL and private-key setting of librdkafka.
SECRET_NAME = re.compile(r"password|passwd|secret|credential|token|sasl\.|ssl\.key", re.I)
#: A URL with a password: scheme://user:PASSWORD@host.
URL_PASSWORD = re.compile(r"://[^/@\s:]*:[^@\s/]+@")


def secrets_in(argv: Sequence[str]) -> list[str]:
    """The words of a command line that carry a secret: a `key=value` or a flag whose name looks
    secret (`sasl.password=...`, `--auth-token`), or a URL with a password. A command line is
    visible to every user of the host (`ps`, /proc/PID/cmdline); secrets go in the environment."""
    found = []
    for word in argv:
        # Every name of the word: `--kafka-config=sasl.password=x` holds two.
        name = " ".join(word.split("=")[:-1]) if "=" in word else word
        name = name if "=" in word or word.startswith("-") else ""
        if SECRET_NAME.search(name) or URL_PASSWORD.search(word):
            found.append(word)
    return found


def check_no_secret(argv: Sequence[str], where: str) -> None:
    """No secret on the command line `argv` (see `secrets_in`)."""
    found = secrets_in(argv)
    assert not found, (
        f"{where}: a secret on the command line, where `ps` shows it: {found}; give it in the "
        "environment (OUTBOX_KAFKA_CONFIG_<NAME>, a Secret, an env_file)"
    )


def check_kafka_settings(args: argparse.Namespace, where: str) -> None:
    """The librdkafka settings a producer or consumer is given (by flag, variable or file) are
    ones librdkafka knows, with values it takes: a client is made with them (and closed; it
    connects to nothing in that time)."""
    from confluent_kafka import Consumer, KafkaException, Producer

    if args.command not in ("producer", "consumer"):
        return
    settings = {
        "bootstrap.servers": "127.0.0.1:1",
        "log_level": 0,
        **dict(args.kafka_config),
    }
    try:
        if args.command == "producer":
            Producer(settings).flush(0)
        else:
            Consumer({"group.id": "check", **settings}).close()
    except KafkaException as exc:
        pytest.fail(f"{where}: librdkafka refuses its settings: {exc}", pytrace=False)
