"""Masking of secrets: URLs, key=value strings, librdkafka settings, log lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from outbox.observability.logs import JsonFormatter, RedactingFormatter, configure_logging
from outbox.observability.redact import (
    MASK,
    forget_secrets,
    is_secret_key,
    redact_settings,
    redact_text,
    redact_url,
    remember_secrets,
    secrets_of_settings,
    secrets_of_url,
)


@pytest.fixture(autouse=True)
def _no_remembered_secrets() -> Iterator[None]:
    forget_secrets()
    yield
    forget_secrets()


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/app", "postgresql://app:***@db:5432/app"),
        ("postgresql+psycopg://app:s3cret@db/app", "postgresql+psycopg://app:***@db/app"),
        ("postgresql://app:p@ss@db/app", "postgresql://app:***@db/app"),
        ("postgresql://:s3cret@db/app", "postgresql://:***@db/app"),
        (
            "postgresql://db/app?user=u&password=s3cret&x=1",
            "postgresql://db/app?user=u&password=***&x=1",
        ),
        ("host=db user=app password=s3cret dbname=app", "host=db user=app password=*** dbname=app"),
        ("host=db password='s3 cret' dbname=app", "host=db password=*** dbname=app"),
        # Nothing secret: unchanged.
        ("postgresql://app@db:5432/app", "postgresql://app@db:5432/app"),
        ("postgresql://db:5432/app?options=a@b", "postgresql://db:5432/app?options=a@b"),
    ],
)
def test_redact_url_masks_only_the_password(url: str, masked: str) -> None:
    assert redact_url(url) == masked


def test_redact_text_masks_urls_and_secret_assignments_inside_messages() -> None:
    text = (
        'missing "=" after "postgresq://app:hunter2@db/x" in connection info string; '
        'sasl.password=kafka-pw ssl.key.password="k p" sasl.username=bob'
    )
    masked = redact_text(text)
    assert "hunter2" not in masked and "kafka-pw" not in masked and "k p" not in masked
    assert "postgresq://app:***@db/x" in masked
    assert "sasl.username=bob" in masked
    assert redact_text('password authentication failed for user "app"') == (
        'password authentication failed for user "app"'
    )


def test_remembered_secrets_are_masked_wherever_they_appear() -> None:
    text = 'invalid percent-encoded token: "pa%zzword"'
    assert redact_text(text) == text  # no pattern recognises it
    remember_secrets(secrets_of_url("postgresql://app:pa%zzword@db/app"))
    assert redact_text(text) == f'invalid percent-encoded token: "{MASK}"'


def test_short_secrets_are_not_remembered() -> None:
    remember_secrets({"ab"})
    assert redact_text("abc cab") == "abc cab"


def test_secrets_of_url_finds_raw_and_decoded_passwords() -> None:
    assert secrets_of_url("postgresql://app:p%40ss%2Fword@db/app") == {
        "p%40ss%2Fword",
        "p@ss/word",
    }
    assert secrets_of_url("host=db password='s3 cret'") == {"s3 cret"}
    assert secrets_of_url("postgresql://app@db/app") == set()


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.key.pem",
        "sasl.oauthbearer.config",
        "SASL.PASSWORD",
        "my.custom.secret.thing",
    ],
)
def test_secret_keys(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["sasl.username", "acks", "bootstrap.servers", "ssl.ca.location"])
def test_ordinary_keys(key: str) -> None:
    assert not is_secret_key(key)


def test_redact_settings_masks_secret_values_and_urls() -> None:
    settings = {
        "sasl.password": "pw1",
        "sasl.oauthbearer.client.secret": "pw2",
        "sasl.username": "bob",
        "sasl.oauthbearer.token.endpoint.url": "https://id:pw3@idp/token",
        "linger.ms": 5,
    }
    assert redact_settings(settings) == {
        "sasl.password": MASK,
        "sasl.oauthbearer.client.secret": MASK,
        "sasl.username": "bob",
        "sasl.oauthbearer.token.endpoint.url": "https://id:***@idp/token",
        "linger.ms": 5,
    }
    assert secrets_of_settings(settings) == {"pw1", "pw2", "pw3"}


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("outbox.test", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_json_lines_carry_extra_fields_and_mask_secrets_everywhere() -> None:
    remember_secrets({"hunter22"})
    record = _record(
        "cannot connect to %s",
        "postgresql://app:hunter22@db/app",
        topic="orders",
        counts={"orders": 3},
        detail="key sasl.password=hunter22",
    )
    entry = json.loads(JsonFormatter().format(record))
    assert entry["level"] == "WARNING" and entry["logger"] == "outbox.test"
    assert entry["timestamp"].endswith("+00:00")
    assert entry["message"] == "cannot connect to postgresql://app:***@db/app"
    assert entry["topic"] == "orders" and entry["counts"] == {"orders": 3}
    assert "hunter22" not in json.dumps(entry)


def test_json_lines_carry_the_traceback_in_one_field() -> None:
    try:
        raise ValueError("bad password=s3cret")
    except ValueError:
        record = logging.LogRecord(
            "outbox",
            logging.ERROR,
            __file__,
            1,
            "failed",
            (),
            exc_info=__import__("sys").exc_info(),
        )
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert "ValueError: bad password=***" in entry["exception"]


def test_text_format_masks_secrets() -> None:
    remember_secrets({"hunter22"})
    line = RedactingFormatter("%(message)s").format(_record("pw is hunter22"))
    assert line == "pw is ***"


def test_configure_logging_writes_json_lines_at_the_level_asked() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("warning", "json", stream)
        logging.getLogger("outbox.test").info("not shown")
        logging.getLogger("outbox.test").warning("shown", extra={"topic": "t"})
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0])["topic"] == "t"
