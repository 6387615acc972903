"""`outbox log-groups forget` and `outbox log-topics list|create|alter`: administering the
PostgreSQL log (outbox.pglog)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from outbox.cli.arguments import (
    ENV_LOG_URL,
    add_log,
    require,
)
from outbox.cli.common import DatabaseCommandFailed, _print, _safe, _table, _topic
from outbox.core.errors import OutboxError
from outbox.core.text import first_line

if TYPE_CHECKING:
    from outbox.pglog.log import TopicInfo


class NoSuchGroup(OutboxError, LookupError):
    """`log-groups forget` named a consumer group the log does not know."""


def _partitions(text: str) -> int:
    from outbox.pglog.log import MAX_PARTITIONS

    try:
        number = int(text)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_PARTITIONS:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_PARTITIONS}, got {text!r}"
        )
    return number


def add_log_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `log-groups` and `log-topics` to the `outbox` command's subparsers."""
    groups = commands.add_parser(
        "log-groups",
        help="forget a consumer group of the PostgreSQL log (--transport postgres)",
        description="Administer the consumer groups of the PostgreSQL log. See "
        "docs/how-to/postgres-log.md.",
    )
    group_actions = groups.add_subparsers(
        dest="log_groups_command",
        required=True,
        metavar="ACTION",
    )
    forget = group_actions.add_parser(
        "forget",
        help="drop a group's committed offsets, so that they no longer hold back retention",
        description="Drop the committed offsets of a consumer group that is gone for good: "
        "the log's retention keeps every record a known group has not read, so a group that "
        "no consumer reads any more holds records back until it is forgotten. Refused, and "
        "nothing changes, for a group the log does not know or one with a consumer running "
        "(stop its consumers first). A consumer started later with the same --group starts as "
        "a new group, at the earliest record the log keeps.",
    )
    add_log(forget)
    forget.add_argument("group", metavar="GROUP", help="the group (its consumers' --group)")

    topics = commands.add_parser(
        "log-topics",
        help="list the PostgreSQL log's topics, create one, or add partitions to one",
        description="Administer the topics of the PostgreSQL log (--transport postgres). A "
        "producer creates a topic on first publish with its --log-partitions; these commands "
        "list topics, create one ahead, and add partitions. See docs/how-to/postgres-log.md.",
    )
    topic_actions = topics.add_subparsers(
        dest="log_topics_command",
        required=True,
        metavar="ACTION",
    )
    listing = topic_actions.add_parser(
        "list",
        help="the topics with their partitions and records",
        description="The log's topics (or those named) with their partitions, records kept "
        "(offsets from the earliest kept to the end) and end (records ever appended).",
    )
    add_log(listing)
    listing.add_argument("names", nargs="*", metavar="TOPIC", help="only these topics")
    listing.add_argument(
        "--by-partition",
        action="store_true",
        help="one line per partition: its earliest offset kept, end and records",
    )
    listing.add_argument("--json", action="store_true", help="print one JSON document")
    create = topic_actions.add_parser(
        "create",
        help="create a topic with a number of partitions",
        description="Create a topic before any producer writes to it (which would create it "
        "with its --log-partitions). Refused, exit 1, if it exists.",
    )
    add_log(create)
    create.add_argument("name", type=_topic, metavar="TOPIC", help="the topic's name")
    create.add_argument(
        "--partitions", type=_partitions, default=8, help="how many partitions (default 8)"
    )
    alter = topic_actions.add_parser(
        "alter",
        help="add partitions to a topic (never removes any)",
        description="Give a topic --partitions partitions by adding new ones (numbers missing "
        "below the highest, partition rows deleted by hand, are added back first). Running "
        "producers use them within about 5 s, consumers within about a second. Most keys then "
        "map to another partition, murmur2(key) % partitions, as when partitions are added "
        "to a Kafka topic: such a key's records from before and after are in different "
        "partitions, with no order between them. Partitions cannot be removed: fewer than "
        "the topic has is refused (exit 1, nothing changed).",
    )
    add_log(alter)
    alter.add_argument("name", metavar="TOPIC", help="the topic")
    alter.add_argument(
        "--partitions", type=_partitions, required=True, help="the number of partitions wanted"
    )


def _log_groups(args: argparse.Namespace) -> int:
    from outbox.pglog import PgLog, check_log

    url = require(args.log_url, "--log-url", ENV_LOG_URL)
    check_log(url, args.log_schema)  # one line when unreachable or not migrated
    try:
        known = PgLog(url, args.log_schema).forget_group(args.group)
    except psycopg.Error as exc:
        raise DatabaseCommandFailed(
            f"log-groups forget failed in PostgreSQL: {first_line(exc)}"
        ) from None
    if not known:
        raise NoSuchGroup(
            f"log schema {args.log_schema!r} has no consumer group {args.group!r}; nothing was "
            "changed"
        )
    _print(
        f"forgot consumer group {args.group!r} of log schema {args.log_schema!r}: its offsets "
        "no longer hold back retention"
    )
    return 0


def _log_topics(args: argparse.Namespace) -> int:
    from outbox.pglog import PgLog, check_log

    url = require(args.log_url, "--log-url", ENV_LOG_URL)
    check_log(url, args.log_schema)  # one line when unreachable or not migrated
    log = PgLog(url, args.log_schema)
    action = args.log_topics_command
    try:
        if action == "list":
            found = log.topics(args.names or None)
            if args.json:
                _print(json.dumps(_topics_json(args.log_schema, found), indent=2))
            else:
                _print(_topics_text(args.log_schema, found, by_partition=args.by_partition))
        elif action == "create":
            log.create_topic(args.name, args.partitions)
            _print(f"created log topic {args.name!r} with {args.partitions} partitions")
        else:
            before = log.partitions(args.name)
            added = log.grow_topic(args.name, args.partitions)
            if not added:
                _print(
                    f"log topic {args.name!r} has {args.partitions} partitions already "
                    "(nothing to do)"
                )
            else:
                numbers = ", ".join(str(n) for n in added)
                _print(
                    f"log topic {args.name!r} grew from {before} to {args.partitions} "
                    f"partitions (added {numbers}); keys now map to other partitions "
                    f"(murmur2(key) % {args.partitions}): a moved key's later records are "
                    "not ordered after its earlier ones; running producers and consumers "
                    "pick the new partitions up within seconds"
                )
    except psycopg.Error as exc:
        raise DatabaseCommandFailed(
            f"log-topics {action} failed in PostgreSQL: {first_line(exc)}"
        ) from None
    return 0


def _topics_json(schema: str, topics: Sequence[TopicInfo]) -> dict[str, Any]:
    return {
        "log_schema": schema,
        "topics": [
            {
                "name": t.name,
                "records": t.records,
                "end": t.end,
                "partitions": [
                    {
                        "partition": p.partition,
                        "earliest": p.earliest,
                        "end": p.end,
                        "records": p.records,
                    }
                    for p in t.partitions
                ],
            }
            for t in topics
        ],
    }


def _topics_text(schema: str, topics: Sequence[TopicInfo], *, by_partition: bool) -> list[str]:
    if not topics:
        return [f"log schema {schema!r} has no topics"]
    if by_partition:
        body = [
            [_safe(t.name), str(p.partition), str(p.earliest), str(p.end), str(p.records)]
            for t in topics
            for p in t.partitions
        ]
        return _table(["TOPIC", "PARTITION", "EARLIEST", "END", "RECORDS"], body)
    body = [[_safe(t.name), str(len(t.partitions)), str(t.records), str(t.end)] for t in topics]
    return _table(["TOPIC", "PARTITIONS", "RECORDS", "END"], body)
