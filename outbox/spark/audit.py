"""The delivery audit: what was sent on Kafka against what each service's inbox received and
handled, per topic and service, as a Spark batch job (`outbox spark audit`).

For the messages created in a window `[since, until)`, per (topic, service):

- **sent**: distinct outbox message ids on Kafka (records without an `outbox-message-id` header
  get the id the Consumer gives them, derived from topic, partition, offset, timestamp and a
  digest of key, value and headers: docs/decisions/0008-foreign-record-identity.md);
- **resent**: ids found at more than one Kafka offset: the relay re-sent them after a crash
  (at-least-once, normal; the inbox stores them once), reported, not a problem;
- **received**: ids found in the service's `consumer_queue`, split into **pending**, **handled**
  (`processed_at` set) and **dead**;
- **missing**: sent but not in the inbox; **duplicated**: inbox rows of the window handled
  more than once (`handled_count > 1`, counted by the Handler in the transaction that marks a
  row processed);
- **not_on_kafka**: inbox rows created in the window whose id is not on Kafka (Kafka retention
  shorter than the window, or rows written by other means), reported, not a problem;
- end-to-end **latency** percentiles (p50, p95, p99, max; approximate, relative rank error
  1/10,000) from the message's created time (the `outbox-created-at` header, the sending
  service's database clock) to its handling (`processed_at`, the receiving service's clock).

The exit code is 3 when anything is missing or duplicated (`EXIT_PROBLEMS`), so the audit can
gate a deploy; 0 otherwise; 1 on bad input or an unreachable database or broker.

**Limits.** A handled message's id (`consumer_processed`) is deleted once it is older than the
Handler's dedup window (`outbox handler --dedup-window`, one day by default); a message handled
before that would look
missing. So the window starts, by default, a margin after `now - dedup window` (pass the
service's `--dedup-window` when it is not the default); a `--since` further back is allowed
with a warning. A message handled twice *after* its row was forgotten (a replay from the start
of a topic) is recorded again with handled_count 1: the audit cannot see it. Messages created in
the last `--settle` seconds, or put on Kafka in that time, are left out: they may still be on
their way. Dead rows purged by an operator look missing. Only messages on Kafka can be
counted: a message still waiting in a producer's outbox is in neither column.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from outbox.core.errors import ConfigurationError
from outbox.core.headers import CREATED_AT, MESSAGE_ID
from outbox.core.topics import validate_topic
from outbox.kafka.subscriber import FOREIGN_NAMESPACE
from outbox.postgres.queries import validate_schema
from outbox.spark.audit_output import (
    AuditReport,
    AuditRow,
    format_table,
    write_chart,
    write_json,
    write_parquet,
)
from outbox.spark.inbox_reader import InboxSource, default_partitions, inbox_bounds

log = logging.getLogger("outbox.spark.audit")

#: The Handler's default dedup window (seconds): handled message ids older than it are deleted.
DEFAULT_DEDUP_WINDOW = 24 * 3600.0
#: Default --settle (seconds): messages this recent are not audited yet.
DEFAULT_SETTLE = 60.0
#: The default window starts this much (at most) after `now - dedup window`, for clock skew
#: between the services and the time the audit itself takes.
SKEW_MARGIN = 300.0
#: Percentiles of the latency, and the accuracy of Spark's percentile_approx.
PERCENTILES = (0.5, 0.95, 0.99)
PERCENTILE_ACCURACY = 10_000

_SERVICE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# -- configuration --------------------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    """A consuming service: its database, its outbox schema, and the topics it consumes."""

    name: str
    database_url: str
    schema: str = "outbox"
    #: The audited topics this service consumes; None: all of them.
    topics: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not _SERVICE_NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"service name {self.name!r} is not valid: use 1-100 letters, digits, '.', '_', '-'"
            )
        if not self.database_url:
            raise ConfigurationError(f"service {self.name!r} has no database URL")
        validate_schema(self.schema)


@dataclass(frozen=True)
class AuditConfig:
    """Settings of one audit run; validated at construction."""

    topics: tuple[str, ...]
    services: tuple[Service, ...]
    kafka_bootstrap: str
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    #: Created-time window; None: `now - dedup_window` plus a margin, and now.
    since: datetime | None = None
    until: datetime | None = None
    settle: float = DEFAULT_SETTLE
    dedup_window: float = DEFAULT_DEDUP_WINDOW
    #: Examples listed per problem kind (the counts are always complete).
    list_limit: int = 100
    #: Input partitions per inbox table; None: one per 500,000 ids.
    inbox_partitions: int | None = None
    #: Kafka reader: "python" (outbox's source) or "kafka" (Spark's JVM connector).
    connector: str = "python"

    def __post_init__(self) -> None:
        if not self.topics:
            raise ConfigurationError("at least one --topic is required")
        for topic in self.topics:
            validate_topic(topic)
        if len(set(self.topics)) != len(self.topics):
            raise ConfigurationError("a --topic is given twice")
        if not self.services:
            raise ConfigurationError("at least one --service NAME=DATABASE_URL is required")
        names = [s.name for s in self.services]
        if len(set(names)) != len(names):
            raise ConfigurationError("a --service name is given twice")
        for service in self.services:
            for topic in service.topics or ():
                if topic not in self.topics:
                    raise ConfigurationError(
                        f"service {service.name!r} consumes {topic!r}, which is not a --topic"
                    )
        if not self.kafka_bootstrap:
            raise ConfigurationError(
                "--kafka-bootstrap is required (or set OUTBOX_KAFKA_BOOTSTRAP)"
            )
        for name, moment in (("since", self.since), ("until", self.until)):
            if moment is not None and moment.tzinfo is None:
                raise ConfigurationError(f"{name} must be timezone-aware")
        if not (self.settle >= 0 and math.isfinite(self.settle)):
            raise ConfigurationError(f"--settle must be >= 0 seconds, got {self.settle}")
        if not (self.dedup_window >= 0 and math.isfinite(self.dedup_window)):
            raise ConfigurationError(
                f"--dedup-window must be >= 0 seconds, got {self.dedup_window}"
            )
        if self.list_limit < 0:
            raise ConfigurationError(f"--list-limit must be >= 0, got {self.list_limit}")
        if self.connector not in ("python", "kafka"):
            raise ConfigurationError(f"--connector must be python or kafka, got {self.connector!r}")
        if self.inbox_partitions is not None and self.inbox_partitions < 1:
            raise ConfigurationError(f"inbox_partitions must be >= 1, got {self.inbox_partitions}")

    def assignments(self) -> list[tuple[str, str]]:
        """The audited (service, topic) pairs."""
        return [
            (service.name, topic)
            for service in self.services
            for topic in self.topics
            if service.topics is None or topic in service.topics
        ]


@dataclass(frozen=True)
class Window:
    """The created-time window audited, and the cut-off of "settled" Kafka records."""

    since: datetime
    until: datetime
    #: Records put on Kafka at or after this are left out (they may still be on their way).
    settled_before: datetime


def resolve_window(config: AuditConfig, now: datetime) -> tuple[Window, list[str]]:
    """The window to audit at `now`, and warnings about it; ConfigurationError when empty."""
    notes: list[str] = []
    oldest_kept = now - timedelta(seconds=config.dedup_window)
    if config.since is None:
        margin = min(SKEW_MARGIN, config.dedup_window * 0.05)
        since = oldest_kept + timedelta(seconds=margin)
    else:
        since = config.since
        if since < oldest_kept:
            notes.append(
                f"--since is before now - dedup window ({config.dedup_window:g}s): messages "
                "handled that long ago may have been forgotten by the inbox and count as missing"
            )
    settled_before = now - timedelta(seconds=config.settle)
    until = min(config.until or settled_before, settled_before)
    if since >= until:
        raise ConfigurationError(
            f"nothing to audit: the window {since.isoformat()} .. {until.isoformat()} is empty "
            "(check --since/--until, --settle and --dedup-window)"
        )
    return Window(since=since, until=until, settled_before=settled_before), notes


def parse_service(text: str, default_schema: str = "outbox") -> Service:
    """Parse `--service NAME=DATABASE_URL[#SCHEMA]`."""
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ConfigurationError(
            f"--service expects NAME=DATABASE_URL[#SCHEMA], got {_redact(text)!r}"
        )
    url, hash_, schema = rest.strip().rpartition("#") if "#" in rest else (rest.strip(), "", "")
    if hash_ and not schema:
        raise ConfigurationError(f"--service {name.strip()}: empty schema after '#'")
    if not url:
        raise ConfigurationError(f"--service {name.strip()}: empty database URL")
    return Service(name=name.strip(), database_url=url, schema=schema or default_schema)


def parse_service_topics(text: str) -> tuple[str, tuple[str, ...]]:
    """Parse `--service-topics NAME=TOPIC[,TOPIC...]`."""
    name, sep, rest = text.partition("=")
    topics = tuple(t.strip() for t in rest.split(",") if t.strip())
    if not sep or not name.strip() or not topics:
        raise ConfigurationError(f"--service-topics expects NAME=TOPIC[,TOPIC...], got {text!r}")
    return name.strip(), topics


def with_topics(
    services: Sequence[Service], topics: Sequence[tuple[str, tuple[str, ...]]]
) -> tuple[Service, ...]:
    """Apply `--service-topics` restrictions to the parsed services."""
    by_name = dict(topics)
    known = {s.name for s in services}
    for name in by_name:
        if name not in known:
            raise ConfigurationError(f"--service-topics names {name!r}, which is not a --service")
    return tuple(
        Service(s.name, s.database_url, s.schema, by_name.get(s.name, s.topics)) for s in services
    )


def parse_time(text: str, flag: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it has no offset) or an age before `now` (90s, 30m, 6h, 2d)."""
    value = text.strip()
    age = _AGE.fullmatch(value)
    if age:
        return now - timedelta(seconds=float(age.group(1)) * _AGE_UNITS[age.group(2)])
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigurationError(
            f"{flag} {text!r} is not a time: use ISO 8601 (2026-11-27T10:00:00Z) or an age "
            "(90s, 30m, 6h, 2d)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _redact(text: str) -> str:
    """`text` with the password of a URL in it hidden."""
    return re.sub(r"(://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


# -- Kafka records -> message identities ----------------------------------------------------


def _header(headers: Any, name: str) -> Any:
    """The value (string) of the first header called `name`, else NULL."""
    matching = F.filter(headers, lambda h: h["key"] == F.lit(name))
    return F.try_element_at(matching, F.lit(1))["value"].cast("string")


def canonical_uuid(text: Any) -> Any:
    """A UUID string in canonical lower-case form, as Python's uuid.UUID parses it, else NULL.

    Accepts what uuid.UUID accepts: optional `urn:`/`uuid:` prefixes, braces and hyphens.
    """
    bare = F.regexp_replace(F.lower(text), r"^(urn:)?(uuid:)?", "")
    bare = F.regexp_replace(F.regexp_replace(bare, r"^\{|\}$", ""), "-", "")
    hex32 = bare.rlike(r"^[0-9a-f]{32}$")
    return F.when(
        hex32,
        F.concat_ws(
            "-",
            F.substring(bare, 1, 8),
            F.substring(bare, 9, 4),
            F.substring(bare, 13, 4),
            F.substring(bare, 17, 4),
            F.substring(bare, 21, 12),
        ),
    )


def _framed(data: Any) -> Any:
    """A binary column as `<byte length>:<bytes>`, `-` when NULL (as the Consumer frames it)."""
    length = F.encode(F.concat(F.length(data).cast("string"), F.lit(":")), "UTF-8")
    return F.when(data.isNull(), F.lit(bytearray(b"-"))).otherwise(F.concat(length, data))


def foreign_id(
    topic: Any, partition: Any, offset: Any, timestamp: Any, key: Any, value: Any, headers: Any
) -> Any:
    """`outbox.kafka.subscriber.foreign_id` as a Spark expression: uuid5 of
    "topic/partition/offset/timestamp ms/sha256 of the framed key, value and headers"."""
    framed_headers = F.aggregate(
        F.coalesce(headers, F.array().cast("array<struct<key:string,value:binary>>")),
        F.lit(bytearray()),
        lambda acc, h: F.concat(acc, _framed(F.encode(h["key"], "UTF-8")), _framed(h["value"])),
    )
    record = F.concat(_framed(key), _framed(value), framed_headers)
    millis = F.coalesce(F.unix_millis(timestamp), F.lit(-1))
    name = F.concat_ws(
        "/",
        topic,
        partition.cast("string"),
        offset.cast("string"),
        millis.cast("string"),
        F.sha2(record, 256),
    )
    digest = F.sha1(F.concat(F.unhex(F.lit(FOREIGN_NAMESPACE.hex)), F.encode(name, "UTF-8")))
    variant = F.lower(
        F.conv(
            (
                (F.conv(F.substring(digest, 17, 1), 16, 10).cast("int").bitwiseAND(3)).bitwiseOR(8)
            ).cast("string"),
            10,
            16,
        )
    )
    return F.concat(
        F.substring(digest, 1, 8),
        F.lit("-"),
        F.substring(digest, 9, 4),
        F.lit("-5"),
        F.substring(digest, 14, 3),
        F.lit("-"),
        variant,
        F.substring(digest, 18, 3),
        F.lit("-"),
        F.substring(digest, 21, 12),
    )


def utc_timestamp(text: Any, session_zone: str) -> Any:
    """An ISO 8601 time as a timestamp; without an offset it is UTC (as the Consumer reads it,
    whatever the session's time zone); NULL when it does not parse."""
    parsed = F.try_to_timestamp(text)
    zoned = text.rlike(r"([zZ]|[+-]\d{2}(:?\d{2})?)$") & text.rlike(r"\d[T ]\d")
    return F.when(zoned, parsed).otherwise(F.from_utc_timestamp(parsed, session_zone))


def _session_zone(frame: DataFrame) -> str:
    """The time zone the session reads naive timestamps in."""
    return str(frame.sparkSession.conf.get("spark.sql.session.timeZone"))


def message_identities(records: DataFrame) -> DataFrame:
    """Kafka records (topic, partition, offset, timestamp, key, value, headers) -> the inbox's
    view of them.

    Columns: topic, partition, offset, timestamp (Kafka's), message_id (as the Consumer
    derives it), created_at (the outbox-created-at header, else the Kafka timestamp, as the
    Consumer stores it).
    """
    own_id = canonical_uuid(_header(records["headers"], MESSAGE_ID))
    created = utc_timestamp(_header(records["headers"], CREATED_AT), _session_zone(records))
    return records.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        F.coalesce(
            own_id,
            foreign_id(
                records["topic"],
                records["partition"],
                records["offset"],
                records["timestamp"],
                records["key"],
                records["value"],
                records["headers"],
            ),
        ).alias("message_id"),
        F.coalesce(created, records["timestamp"]).alias("created_at"),
    )


# -- the audit over DataFrames --------------------------------------------------------------


def _ms_between(start: Any, end: Any) -> Any:
    """Milliseconds from one timestamp column to another, as a double."""
    return (F.unix_micros(end) - F.unix_micros(start)) / 1000.0


#: Columns of `deliveries`, the frame every count and listing of the audit comes from.
DELIVERY_COLUMNS = (
    "service",
    "topic",
    "message_id",
    "on_kafka",  # a record with this id and a created time in the window is on Kafka
    "settled",  # ... and its first copy was put there before the settle cut-off
    "copies",  # records with this id on Kafka (more than one: re-sent by a relay)
    "partition",  # of the first copy
    "offset",
    "created_at",
    "received",  # in the service's inbox (pending, handled or dead)
    "processed_at",
    "dead_at",
    "handled_count",
)


def deliveries(
    identities: DataFrame, inbox: DataFrame, assignments: DataFrame, window: Window
) -> DataFrame:
    """What Kafka has against what each inbox has, one row per (service, topic, message_id).

    identities: `message_identities(...)` of the audited topics; inbox: (service, message_id,
    topic, created_at, processed_at, dead_at, handled_count); assignments: (service, topic), the
    topics each service consumes. Both sides are restricted to created times in the window; a
    full outer join keeps the ids only one side has. Columns: DELIVERY_COLUMNS.
    """
    since, until = F.lit(window.since), F.lit(window.until)
    in_window = identities.where((F.col("created_at") >= since) & (F.col("created_at") < until))
    first = F.min(F.struct("partition", "offset"))
    first_put = F.min(F.coalesce(F.col("timestamp"), F.lit(datetime(1970, 1, 1, tzinfo=UTC))))
    sent = in_window.groupBy("topic", "message_id").agg(
        F.count(F.lit(1)).alias("copies"),
        first["partition"].alias("partition"),
        first["offset"].alias("offset"),
        F.min("created_at").alias("sent_created_at"),
        (first_put < F.lit(window.settled_before)).alias("settled"),
    )
    expected = sent.join(F.broadcast(assignments), "topic")
    received = (
        inbox.where((F.col("created_at") >= since) & (F.col("created_at") < until))
        .join(F.broadcast(assignments), ["service", "topic"])
        .select(
            "service",
            "topic",
            "message_id",
            F.lit(True).alias("received"),
            F.col("created_at").alias("inbox_created_at"),
            "processed_at",
            "dead_at",
            "handled_count",
        )
    )
    joined = expected.join(received, ["service", "topic", "message_id"], "full_outer")
    return joined.select(
        "service",
        "topic",
        "message_id",
        F.col("copies").isNotNull().alias("on_kafka"),
        F.coalesce("settled", F.lit(False)).alias("settled"),
        F.coalesce("copies", F.lit(0)).alias("copies"),
        "partition",
        "offset",
        F.coalesce("sent_created_at", "inbox_created_at").alias("created_at"),
        F.coalesce("received", F.lit(False)).alias("received"),
        "processed_at",
        "dead_at",
        F.coalesce("handled_count", F.lit(0)).alias("handled_count"),
    )


def _sent() -> Any:
    """The deliveries counted as sent: on Kafka, settled."""
    return F.col("on_kafka") & F.col("settled")


def _problem(kind: str) -> Any:
    """The condition of each listed problem kind."""
    if kind == "missing":
        return _sent() & ~F.col("received")
    if kind == "duplicated":
        return F.col("received") & (F.col("handled_count") > 1)
    if kind == "resent":
        return _sent() & (F.col("copies") > 1)
    raise ValueError(kind)


def summarize(frame: DataFrame) -> DataFrame:
    """One row per (topic, service) with deliveries: counts and latency percentiles (ms)."""
    sent, received = _sent(), F.col("received")
    handled = received & F.col("processed_at").isNotNull()
    dead = received & F.col("processed_at").isNull() & F.col("dead_at").isNotNull()
    latency = F.when(sent & handled, _ms_between(F.col("created_at"), F.col("processed_at")))
    percentiles = F.percentile_approx(latency, list(PERCENTILES), PERCENTILE_ACCURACY)

    def count(condition: Any, name: str) -> Any:
        return F.count(F.when(condition, 1)).alias(name)

    return frame.groupBy("topic", "service").agg(
        count(sent, "sent"),
        count(_problem("resent"), "resent"),
        count(sent & received, "received"),
        count(sent & handled, "handled"),
        count(sent & dead, "dead"),
        count(_problem("missing"), "missing"),
        count(_problem("duplicated"), "duplicated"),
        count(~F.col("on_kafka"), "not_on_kafka"),
        percentiles.alias("percentiles"),
        F.max(latency).alias("max_ms"),
    )


#: The details listed with each problem kind, and the order of the listing.
_LISTINGS = {
    "missing": (("partition", "offset", "created_at"), ("topic", "service", "partition", "offset")),
    "duplicated": (("handled_count", "processed_at"), ("topic", "service", "partition", "offset")),
    "resent": (("copies",), ("topic", "partition", "offset")),
}


def collect_report(
    frame: DataFrame,
    assignments: Sequence[tuple[str, str]],
    window: Window,
    *,
    list_limit: int,
    generated_at: datetime,
    notes: Sequence[str] = (),
) -> AuditReport:
    """Aggregate `deliveries` and collect the (small) report on the driver.

    One Spark job for the counts, and one per problem kind found, for its first examples.
    """
    summary = {(r["topic"], r["service"]): r for r in summarize(frame).collect()}
    rows = [
        _row(topic, service, summary.get((topic, service)))
        for service, topic in sorted(assignments, key=lambda a: (a[1], a[0]))
    ]
    listed: dict[str, list[dict[str, Any]]] = {}
    for kind, (details, order) in _LISTINGS.items():
        found = sum(getattr(row, kind) for row in rows)
        listed[kind] = _examples(frame, kind, order, details, min(found, list_limit))
    resent = [{k: v for k, v in r.items() if k != "service"} for r in listed["resent"]]
    return AuditReport(
        since=window.since,
        until=window.until,
        generated_at=generated_at,
        rows=tuple(rows),
        missing=tuple(listed["missing"]),
        duplicated=tuple(listed["duplicated"]),
        resent=tuple(resent),
        list_limit=list_limit,
        notes=tuple(notes),
    )


def _row(topic: str, service: str, agg: Any) -> AuditRow:
    """The report row of one (topic, service) from its aggregate (None: nothing in the window)."""
    if agg is None:
        return AuditRow(topic=topic, service=service)
    p50, p95, p99 = agg["percentiles"] or (None, None, None)
    return AuditRow(
        topic=topic,
        service=service,
        sent=agg["sent"],
        resent=agg["resent"],
        received=agg["received"],
        pending=agg["received"] - agg["handled"] - agg["dead"],
        handled=agg["handled"],
        dead=agg["dead"],
        missing=agg["missing"],
        duplicated=agg["duplicated"],
        not_on_kafka=agg["not_on_kafka"],
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        max_ms=agg["max_ms"],
    )


def _examples(
    frame: DataFrame, kind: str, order: Sequence[str], details: Sequence[str], limit: int
) -> list[dict[str, Any]]:
    """The first `limit` deliveries with problem `kind` (no Spark job when limit is 0)."""
    if limit <= 0:
        return []
    columns = ["topic", "service", "message_id", *details]
    found = frame.where(_problem(kind))
    if kind == "resent":  # re-sent on the topic, whatever the service: listed once
        found = found.dropDuplicates(["topic", "message_id"])
    rows = found.orderBy(*order).select(*columns).limit(limit).collect()
    return [{k: _aware(v) for k, v in row.asDict().items()} for row in rows]


def _aware(value: Any) -> Any:
    """PySpark collects timestamps as naive local times: make them UTC-aware."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.astimezone(UTC)
    return value


# -- reading the sources --------------------------------------------------------------------


def read_inbox(
    spark: SparkSession,
    service: Service,
    topics: Sequence[str],
    window: Window,
    partitions: int | None,
) -> DataFrame | None:
    """The audit columns of one service's inbox for `topics` in the window, or None if empty."""
    bounds = inbox_bounds(service.database_url, service.schema)
    if bounds is None:
        return None
    first_id, last_id = bounds
    spark.dataSource.register(InboxSource)
    frame = (
        spark.read.format(InboxSource.name())
        .option("url", service.database_url)
        .option("schema", service.schema)
        .option("topics", json.dumps(list(topics)))
        .option("since", window.since.isoformat())
        .option("until", window.until.isoformat())
        .option("first_id", str(first_id))
        .option("last_id", str(last_id))
        .option("partitions", str(partitions or default_partitions(first_id, last_id)))
        .load()
    )
    return frame.withColumn("service", F.lit(service.name))


def empty_inbox(spark: SparkSession) -> DataFrame:
    """An inbox frame without rows, for services whose table is empty."""
    return spark.createDataFrame(
        [],
        "message_id string, topic string, created_at timestamp, processed_at timestamp, "
        "dead_at timestamp, handled_count int, service string",
    )


def read_inboxes(spark: SparkSession, config: AuditConfig, window: Window) -> DataFrame:
    """Every service's inbox rows, as one frame with a `service` column."""
    frames = []
    for service in config.services:
        topics = [t for t in config.topics if service.topics is None or t in service.topics]
        frame = read_inbox(spark, service, topics, window, config.inbox_partitions)
        if frame is not None:
            frames.append(frame)
    result = empty_inbox(spark)
    for frame in frames:
        result = result.unionByName(frame)
    return result


def read_identities(spark: SparkSession, config: AuditConfig, window: Window) -> DataFrame:
    """The message identities of the audited topics, from the records put on Kafka since
    `window.since` (minus the skew margin) up to the end offsets at the time of the read."""
    from outbox.spark.source import read_kafka

    start = window.since - timedelta(seconds=SKEW_MARGIN)
    records = read_kafka(
        spark,
        config.kafka_bootstrap,
        list(config.topics),
        starting=start,
        kafka_config=dict(config.kafka_config),
        connector=config.connector,
    )
    return message_identities(records)


# -- the job --------------------------------------------------------------------------------


def audit(spark: SparkSession, config: AuditConfig, *, now: datetime | None = None) -> AuditReport:
    """Run the audit on `spark` and return its report (nothing printed, nothing written)."""
    now = now or datetime.now(UTC)
    window, notes = resolve_window(config, now)
    for note in notes:
        log.warning("%s", note)
    inbox = read_inboxes(spark, config, window)
    identities = read_identities(spark, config, window)
    pairs = config.assignments()
    assignments = spark.createDataFrame(pairs, "service string, topic string")
    # Kept for the listings after the counts: Kafka and the databases are read once.
    frame = deliveries(identities, inbox, assignments, window).persist()
    try:
        return collect_report(
            frame, pairs, window, list_limit=config.list_limit, generated_at=now, notes=notes
        )
    finally:
        frame.unpersist()


# -- the command ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    """Where the report goes besides stdout; each None when not asked for."""

    json: str | None = None
    parquet: str | None = None
    chart: str | None = None

    def __post_init__(self) -> None:
        for flag, path in (
            ("--json", self.json),
            ("--parquet", self.parquet),
            ("--chart", self.chart),
        ):
            if path is None:
                continue
            parent = Path(path).resolve().parent
            if not parent.is_dir():
                raise ConfigurationError(f"{flag} {path}: directory {parent} does not exist")
        if self.chart is not None and not self.chart.lower().endswith(".png"):
            raise ConfigurationError(f"--chart {self.chart}: the chart is a PNG, name it *.png")


def config_from_arguments(args: Any, now: datetime) -> AuditConfig:
    """The AuditConfig of `outbox spark audit` arguments; ConfigurationError on bad input."""
    services = [parse_service(text, args.schema) for text in args.service]
    restrictions = [parse_service_topics(text) for text in args.service_topics]
    return AuditConfig(
        topics=tuple(args.topic),
        services=with_topics(services, restrictions),
        kafka_bootstrap=args.kafka_bootstrap or "",
        kafka_config=dict(args.kafka_config),
        since=parse_time(args.since, "--since", now) if args.since else None,
        until=parse_time(args.until, "--until", now) if args.until else None,
        settle=args.settle,
        dedup_window=args.dedup_window,
        list_limit=args.list_limit,
        connector=args.connector,
    )


def check_sources(config: AuditConfig) -> None:
    """Fail fast, before Spark starts, on an unreachable database or broker, or a wrong schema."""
    from outbox.kafka.publisher import check_reachable

    for service in config.services:
        inbox_bounds(service.database_url, service.schema)
    check_reachable({"bootstrap.servers": config.kafka_bootstrap, **config.kafka_config})


def run_job(
    config: AuditConfig,
    outputs: Outputs,
    *,
    master: str | None = None,
    now: datetime | None = None,
    spark: SparkSession | None = None,
    out: TextIO | None = None,
) -> int:
    """Audit, print the table, write the files asked for; the exit code (0, or 3 on problems)."""
    now = now or datetime.now(UTC)
    resolve_window(config, now)  # an empty window is bad input: say so before Spark starts
    check_sources(config)
    if spark is None:
        report = _audit_in_session(config, master, now)
    else:
        report = audit(spark, config, now=now)
    print(format_table(report), file=out or sys.stdout)
    if outputs.json:
        write_json(report, outputs.json)
    if outputs.parquet:
        write_parquet(report, outputs.parquet)
    if outputs.chart:
        write_chart(report, outputs.chart)
    return report.exit_code


def _audit_in_session(config: AuditConfig, master: str | None, now: datetime) -> AuditReport:
    """Audit in this process's active Spark session, as it is, or in one started (and then
    stopped) here."""
    existing = SparkSession.getActiveSession()
    if existing is not None:
        return audit(existing, config, now=now)
    from outbox.spark.session import spark_session

    spark = spark_session(
        master=master, app_name="outbox-audit", config={"spark.ui.showConsoleProgress": "false"}
    )
    try:
        return audit(spark, config, now=now)
    finally:
        spark.stop()
