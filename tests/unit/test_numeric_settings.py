"""Every numeric flag, environment variable and config field refuses NaN, infinity and values
out of its range: a usage error (exit 2) naming the flag, or a `ConfigurationError` naming the
field. The flags are read from the parser, so a new numeric flag is covered automatically."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any

import pytest

from outbox import Backoff, Broker, ConfigurationError
from outbox.cli import build_parser, main
from outbox.cli.reference import walk
from outbox.core.numbers import INTEGER_RULES, Rule, check, parse
from outbox.daemons.consumer import ConsumerConfig
from outbox.daemons.handler import HandlerConfig
from outbox.daemons.producer import ProducerConfig
from outbox.observability.runtime import ObservabilityConfig

RULES: tuple[Rule, ...] = (
    "seconds",
    "seconds_or_zero",
    "count",
    "count_or_zero",
    "port",
    "threads",
    "poll_records",
)

#: Values no numeric setting accepts.
ALWAYS_BAD = ["nan", "NaN", "inf", "-inf", "infinity", "-1", "1e400", "many", ""]
#: Further values refused, and a value accepted, per rule.
BAD: dict[Rule, list[str]] = {
    # Above the top of each range: past PostgreSQL's timestamps once subtracted from now
    # (seconds), its integer (counts), the threads a process can start, librdkafka's poll.
    "seconds": ["0", "-0.0", "-0.5", "3e11"],
    "seconds_or_zero": ["-0.001", "3e11"],
    "count": ["0", "1.5", "-3", "99999999999999999999"],
    "count_or_zero": ["1.5", "-3", "2147483648"],
    "port": ["65536", "1.5"],
    "threads": ["0", "1001", "100000"],
    "poll_records": ["0", "1000001"],
}
GOOD: dict[Rule, str] = {
    "seconds": "0.25",
    "seconds_or_zero": "0",
    "count": "3",
    "count_or_zero": "0",
    "port": "0",
    "threads": "1000",
    "poll_records": "1000000",
}


def _numeric_flags() -> list[tuple[tuple[str, ...], argparse.Action]]:
    found = []
    for command in walk(build_parser()):
        for action in command.parser._actions:
            if action.type in (int, float) or getattr(action.type, "__name__", None) in RULES:
                found.append((command.path, action))
    return found


FLAGS = _numeric_flags()


def _rule(action: argparse.Action) -> Rule:
    name = getattr(action.type, "__name__", "")
    assert name in RULES, (
        f"{'/'.join(action.option_strings)} uses type={name}: give it "
        "type=outbox.core.numbers.flag_type(...) so nan, inf and out-of-range values are refused"
    )
    return name  # type: ignore[return-value]


def _env(action: argparse.Action) -> str | None:
    found = re.search(r"\(env (OUTBOX_[A-Z_]+)", action.help or "")
    return found.group(1) if found else None


def _id(item: tuple[tuple[str, ...], argparse.Action]) -> str:
    return " ".join((*item[0], item[1].option_strings[0]))


def test_the_table_sees_every_numeric_flag() -> None:
    names = {_id(item) for item in FLAGS}
    for expected in [
        "producer --poll-interval",
        "producer --liveness-timeout",
        "handler --lease",
        "handler --dedup-window",
        "consumer --metrics-port",
        "dead-letters list --limit",
        "spark consumer --trigger-interval",
        "spark audit --settle",
        "handler --concurrency",
        "consumer --batch-size",
    ]:
        assert expected in names, sorted(names)


@pytest.mark.parametrize("item", FLAGS, ids=[_id(item) for item in FLAGS])
def test_every_numeric_flag_refuses_nan_inf_and_out_of_range_values(
    item: tuple[tuple[str, ...], argparse.Action],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, action = item
    rule = _rule(action)
    flag = action.option_strings[-1]
    for bad in [*ALWAYS_BAD, *BAD[rule]]:
        with pytest.raises(SystemExit) as exited:
            main([*path, f"{flag}={bad}"])
        assert exited.value.code == 2, (flag, bad)
        err = capsys.readouterr().err
        assert flag in err and "Traceback" not in err, (bad, err)
    assert action.type is not None
    assert action.type(GOOD[rule]) == parse(GOOD[rule], rule)
    env = _env(action)
    if env is not None:
        for bad in ["nan", "inf", "-1", "1e400"]:
            monkeypatch.setenv(env, bad)
            with pytest.raises(SystemExit) as exited:
                main([*path])
            assert exited.value.code == 2, (env, bad)
            err = capsys.readouterr().err
            assert flag in err and env in err, err


def _with(cls: type, **values: Any) -> Any:
    required: dict[str, Any] = {
        "database_url": "postgresql://db/app",
        "kafka_bootstrap": "kafka:9092",
        "topics": ["t"],
        "group": "g",
    }
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in required.items() if k in names}, **values)


def _numeric_fields(cls: type) -> list[str]:
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.type in ("int", "float", "int | None", "float | None")
    ]


CONFIGS = [ProducerConfig, ConsumerConfig, HandlerConfig, ObservabilityConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=[c.__name__ for c in CONFIGS])
def test_every_numeric_config_field_refuses_nan_inf_and_negatives(cls: type) -> None:
    fields = _numeric_fields(cls)
    assert fields, cls
    for name in fields:
        for bad in [math.nan, math.inf, -math.inf, -1, -1.5, True, "1"]:
            with pytest.raises(ConfigurationError) as info:
                _with(cls, **{name: bad})
            assert str(info.value).startswith(f"{name} must be"), str(info.value)


def test_zero_is_refused_where_it_means_nothing_and_accepted_where_it_means_off() -> None:
    for name in ["batch_size", "poll_interval", "connect_timeout"]:
        with pytest.raises(ConfigurationError, match=name):
            _with(ProducerConfig, **{name: 0})
    for name in ["concurrency", "transaction_size", "lease", "retention_batch"]:
        with pytest.raises(ConfigurationError, match=name):
            _with(HandlerConfig, **{name: 0})
    assert _with(HandlerConfig, dedup_window=0).dedup_window == 0
    assert ObservabilityConfig(metrics_port=0).metrics_port == 0


@pytest.mark.parametrize(
    "values",
    [
        {"initial": math.nan},
        {"maximum": math.nan},
        {"maximum": math.inf},
        {"multiplier": math.nan},
        {"multiplier": math.inf},
        {"jitter": math.nan},
    ],
)
def test_backoff_refuses_nan_and_infinity(values: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError, match="backoff"):
        Backoff(**values)


@pytest.mark.parametrize("rule", RULES)
def test_check_and_parse_agree(rule: Rule) -> None:
    for text in [*ALWAYS_BAD, *BAD[rule]]:
        with pytest.raises(ValueError):
            parse(text, rule)
    value = parse(GOOD[rule], rule)
    assert isinstance(value, int if rule in INTEGER_RULES else float)
    check("x", value, rule)
    with pytest.raises(ConfigurationError, match=r"^x must be"):
        check("x", math.nan, rule)


def test_broker_refuses_a_bool_size_limit() -> None:
    with pytest.raises(ConfigurationError):
        Broker(max_payload_bytes=True)


def test_the_tops_of_the_ranges_name_the_limit() -> None:
    with pytest.raises(ConfigurationError, match=r"dedup_window must be at most 3155760000"):
        _with(HandlerConfig, dedup_window=3e11)
    threads = r"concurrency must be a whole number from 1 to 1000,"
    with pytest.raises(ConfigurationError, match=threads):
        _with(HandlerConfig, concurrency=100_000)
    records = r"batch_size must be a whole number from 1 to 1000000,"
    with pytest.raises(ConfigurationError, match=records):
        _with(ConsumerConfig, batch_size=1_000_001)
    assert _with(ConsumerConfig, batch_size=1_000_000).batch_size == 1_000_000
