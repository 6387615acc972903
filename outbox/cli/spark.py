"""`outbox spark consumer | audit | replay`.

This module must import without pyspark: the arguments are declared here, and each command
imports its job module (and so pyspark) only when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

from outbox.core.numbers import flag_type


def add_spark_commands(commands: Any) -> None:
    """Add `spark` and its subcommands to the `outbox` subparsers."""
    spark = commands.add_parser("spark", help="run the Spark jobs: consumer, audit, replay")
    jobs = spark.add_subparsers(dest="spark_command", required=True, metavar="JOB")
    _add_consumer(jobs)
    _add_audit(jobs)
    _add_replay(jobs)


def run_spark_command(args: argparse.Namespace) -> int:
    """Run the Spark job named by `args.spark_command`; its exit code."""
    if args.spark_command == "consumer":
        return _run_consumer(args)
    if args.spark_command == "audit":
        return _run_audit(args)
    if args.spark_command == "replay":
        return _run_replay(args)
    raise AssertionError(f"unknown spark job {args.spark_command!r}")


# -- consumer -------------------------------------------------------------------------------


MASTER_HELP = "Spark master URL (default: spark-submit's --master, else local[*])"


def _add_consumer(jobs: Any) -> None:
    from outbox.cli.arguments import add_database, add_kafka

    consumer = jobs.add_parser(
        "consumer",
        help="stream Kafka topics into a service's consumer_queue",
        description="A Spark Structured Streaming job: Kafka topics -> consumer_queue, stored "
        "once per message id like `outbox consumer` does. Offsets live in --checkpoint; "
        "restart with the same checkpoint to go on where it stopped.",
    )
    consumer.add_argument(
        "--topic", action="append", default=[], help="topic to consume; repeatable, required"
    )
    add_database(consumer)
    add_kafka(consumer)
    consumer.add_argument(
        "--checkpoint",
        help="checkpoint directory or URL (durable storage on a cluster), required",
    )
    consumer.add_argument(
        "--trigger-interval",
        type=flag_type("seconds_or_zero"),
        default=None,
        metavar="SECONDS",
        help="start a micro-batch every SECONDS (default 1; 0: as soon as the last one ends)",
    )
    consumer.add_argument(
        "--available-now",
        action="store_true",
        help="store what is on Kafka now, in micro-batches, then exit",
    )
    consumer.add_argument(
        "--max-offsets-per-trigger",
        type=flag_type("count"),
        default=None,
        metavar="N",
        help="read at most N records per micro-batch, shared among partitions",
    )
    consumer.add_argument(
        "--starting-offsets",
        default="earliest",
        metavar="WHERE",
        help="where a new checkpoint starts: earliest (default), latest, or group:NAME, where "
        "consumer group NAME committed (to take over from `outbox consumer --group NAME`)",
    )
    consumer.add_argument(
        "--connector",
        choices=("python", "kafka"),
        default="python",
        help="read Kafka with outbox's source (python, default) or Spark's JVM connector",
    )
    consumer.add_argument(
        "--transaction-rows",
        type=flag_type("count"),
        default=10_000,
        metavar="N",
        help="store at most N records per database transaction (default 10000)",
    )
    consumer.add_argument("--master", help=MASTER_HELP)


def _run_consumer(args: argparse.Namespace) -> int:
    from outbox.cli.arguments import ENV_DATABASE_URL, ENV_KAFKA_BOOTSTRAP, require
    from outbox.core.errors import ConfigurationError

    if args.available_now and args.trigger_interval is not None:
        raise ConfigurationError("give --trigger-interval or --available-now, not both")
    stream = _spark_job("consumer", "outbox.spark.stream")
    config = stream.StreamConfig(
        database_url=require(args.database_url, "--database-url", ENV_DATABASE_URL),
        kafka_bootstrap=require(args.kafka_bootstrap, "--kafka-bootstrap", ENV_KAFKA_BOOTSTRAP),
        topics=args.topic,
        checkpoint=args.checkpoint or "",
        schema=args.schema,
        kafka_config=dict(args.kafka_config),
        trigger_interval=1.0 if args.trigger_interval is None else args.trigger_interval,
        available_now=args.available_now,
        max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets=args.starting_offsets,
        connector=args.connector,
        transaction_rows=args.transaction_rows,
    )
    stream.run_stream(config, args.master, stop_on_signals=True)
    return 0


def _spark_job(command: str, module: str) -> Any:
    """Import a job module, or say which extra `outbox spark COMMAND` needs."""
    import importlib

    from outbox.core.errors import ConfigurationError

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"`outbox spark {command}` needs the spark extra (pip install "
            f"'pg-kafka-outbox[spark]'): {exc}"
        ) from None


# -- audit ----------------------------------------------------------------------------------


def _add_audit(jobs: Any) -> None:
    import os

    from outbox.cli.arguments import ENV_SCHEMA, add_kafka

    audit = jobs.add_parser(
        "audit",
        help="compare what was sent on Kafka with what inboxes received and handled",
        description="Per topic and service: sent, received, handled, dead, missing, handled "
        "twice, latency percentiles. Exit code 3 when a message is missing or was handled "
        "twice, 0 otherwise, 1 on bad input.",
    )
    audit.add_argument(
        "--topic", action="append", default=[], help="a topic to audit; repeatable, required"
    )
    audit.add_argument(
        "--service",
        action="append",
        default=[],
        metavar="NAME=DATABASE_URL[#SCHEMA]",
        help="a service consuming the topics, its database and (after #) its outbox schema; "
        "repeatable, required",
    )
    audit.add_argument(
        "--service-topics",
        action="append",
        default=[],
        metavar="NAME=TOPIC[,TOPIC...]",
        help="the topics service NAME consumes (default: every --topic); repeatable",
    )
    audit.add_argument(
        "--schema",
        default=os.environ.get(ENV_SCHEMA, "outbox"),
        help=f"outbox schema of services without #SCHEMA (env {ENV_SCHEMA}; default outbox)",
    )
    add_kafka(audit)
    audit.add_argument(
        "--since",
        help="audit messages created at or after this: ISO 8601 (UTC without an offset) or an "
        "age such as 6h (default: the dedup window ago, plus a 5 min margin)",
    )
    audit.add_argument("--until", help="and before this (default: now minus --settle)")
    audit.add_argument(
        "--settle",
        type=flag_type("seconds_or_zero"),
        default=60.0,
        metavar="SECONDS",
        help="leave out messages created or put on Kafka this recently (default 60)",
    )
    audit.add_argument(
        "--dedup-window",
        type=flag_type("seconds_or_zero"),
        default=24 * 3600.0,
        metavar="SECONDS",
        help="the services' `outbox handler --dedup-window` (default 86400): older processed "
        "rows are forgotten, so the default --since stays inside it",
    )
    audit.add_argument(
        "--list-limit",
        type=flag_type("count_or_zero"),
        default=100,
        metavar="N",
        help="list at most N missing, handled-twice and re-sent message ids each (default 100)",
    )
    audit.add_argument("--json", metavar="PATH", help="write the report as JSON")
    audit.add_argument(
        "--parquet", metavar="PATH", help="write the per topic/service rows as a Parquet file"
    )
    audit.add_argument("--chart", metavar="PATH.png", help="draw the counts and latencies")
    audit.add_argument(
        "--connector",
        choices=("python", "kafka"),
        default="python",
        help="read Kafka with outbox's source (python, default) or Spark's JVM connector",
    )
    audit.add_argument("--master", help=MASTER_HELP)


def _run_audit(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from outbox.cli.arguments import ENV_KAFKA_BOOTSTRAP, require

    require(args.kafka_bootstrap, "--kafka-bootstrap", ENV_KAFKA_BOOTSTRAP)
    audit = _spark_job("audit", "outbox.spark.audit")
    now = datetime.now(UTC)
    config = audit.config_from_arguments(args, now)
    outputs = audit.Outputs(json=args.json, parquet=args.parquet, chart=args.chart)
    code: int = audit.run_job(config, outputs, master=args.master, now=now)
    return code


# -- replay ---------------------------------------------------------------------------------


def _add_replay(jobs: Any) -> None:
    from outbox.cli.arguments import add_database, add_kafka

    replay = jobs.add_parser(
        "replay",
        help="re-inject a range of a topic into a service's inbox",
        description="Read a range of a topic (by offsets or by time) and store it in "
        "consumer_queue; messages still there (pending, or handled within the dedup window) "
        "are skipped. Prints how many were read, inserted and skipped.",
    )
    replay.add_argument("--topic", help="the topic to replay, required")
    add_database(replay)
    add_kafka(replay)
    replay.add_argument(
        "--from-offset",
        action="append",
        default=[],
        metavar="[P:]N",
        help="first offset replayed: N for every partition, P:N for partition P; repeatable. "
        "Naming partitions replays only those (unless N is also given for every partition)",
    )
    replay.add_argument(
        "--to-offset",
        action="append",
        default=[],
        metavar="[P:]N",
        help="first offset NOT replayed (exclusive; default: the end), as --from-offset",
    )
    replay.add_argument(
        "--since",
        metavar="TIME",
        help="replay records with a timestamp at or after TIME (ISO 8601)",
    )
    replay.add_argument(
        "--until", metavar="TIME", help="and before TIME (exclusive; default: the end)"
    )
    replay.add_argument("--master", help=MASTER_HELP)


def _run_replay(args: argparse.Namespace) -> int:
    from outbox.cli.arguments import ENV_DATABASE_URL, ENV_KAFKA_BOOTSTRAP, require
    from outbox.core.errors import ConfigurationError

    if not args.topic:
        raise ConfigurationError("--topic is required")
    replay = _spark_job("replay", "outbox.spark.replay")
    config = replay.ReplayConfig(
        database_url=require(args.database_url, "--database-url", ENV_DATABASE_URL),
        kafka_bootstrap=require(args.kafka_bootstrap, "--kafka-bootstrap", ENV_KAFKA_BOOTSTRAP),
        topic=args.topic,
        schema=args.schema,
        kafka_config=dict(args.kafka_config),
        from_offsets=replay.parse_offsets(args.from_offset, "--from-offset"),
        to_offsets=replay.parse_offsets(args.to_offset, "--to-offset"),
        since=replay.parse_time(args.since, "--since"),
        until=replay.parse_time(args.until, "--until"),
    )
    counts = replay.run_replay(config, args.master)
    print(replay.report(config, counts), end="")
    return 0
