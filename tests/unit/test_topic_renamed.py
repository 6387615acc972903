"""A fixed-name `Topic` under a per-test name: `Topic.renamed` (a copy) and
`outbox.testing.topic_renamed` (the same object, for a block), which sends and the registries
that registered the Topic follow, in every thread, and which always gives the name back."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from outbox import Broker, Handlers, InboxMessage, Topic
from outbox.core.errors import InvalidTopic
from outbox.core.handlers import HandlerConflict
from outbox.testing import per_test_name, topic_renamed

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Order:
    order_id: int
    customer: str


ORDERS = Topic("orders.created", Order, key="order_id", description="An order was placed.")


def _registry() -> Handlers:
    handlers = Handlers()

    @handlers.handler(ORDERS, ordered=False)
    def on_order(message: InboxMessage[Order], conn: object) -> None:
        """Handle an order."""

    @handlers.handler("audit")
    def on_audit(message: InboxMessage[object], conn: object) -> None:
        pass

    return handlers


def _sent_to(topic: Topic[Order]) -> str:
    """The topic `broker.send` would write a message of `topic` to (composed, not written)."""
    return Broker()._compose(topic, Order(1, "ada"), None, None, None).topic


# -- Topic.renamed: a copy -------------------------------------------------------------------


def test_renamed_is_a_copy_under_another_name() -> None:
    copy = ORDERS.renamed("orders.created-test")
    assert copy is not ORDERS
    assert (copy.name, copy.declared_name) == ("orders.created-test", "orders.created-test")
    assert (copy.payload, copy.key, copy.content_type, copy.description) == (
        ORDERS.payload,
        ORDERS.key,
        ORDERS.content_type,
        ORDERS.description,
    )
    assert ORDERS.name == "orders.created"
    assert copy.key_of(Order(7, "ada")) == b"7"
    assert _sent_to(copy) == "orders.created-test"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("x" * 250, "250 characters long; Kafka allows at most 249"),
        ("", "must not be empty"),
        ("orders created", "' '"),
        ("..", "reserved"),
        ("commandes.créées", "'é'"),
    ],
    ids=["250", "empty", "space", "dots", "non-ascii"],
)
def test_an_invalid_new_name_is_refused_clearly(name: str, says: str) -> None:
    with pytest.raises(InvalidTopic, match=r"cannot rename topic 'orders\.created'") as renamed:
        ORDERS.renamed(name)
    assert says in str(renamed.value)
    with pytest.raises(InvalidTopic, match="under another name") as scoped:
        with topic_renamed(ORDERS, name):
            pytest.fail("the block must not run")
    assert says in str(scoped.value)
    assert ORDERS.name == "orders.created"


def test_a_name_of_249_characters_is_kafkas_limit() -> None:
    assert ORDERS.renamed("x" * 249).name == "x" * 249
    with topic_renamed(ORDERS, "y" * 249) as name:
        assert ORDERS.name == name == "y" * 249
    assert ORDERS.name == "orders.created"


def test_renamed_takes_a_str_only() -> None:
    with pytest.raises(InvalidTopic, match="must be a str"):
        ORDERS.renamed(b"orders")  # type: ignore[arg-type]


# -- topic_renamed: the same object, for a block ------------------------------------------------


def test_sends_and_the_registry_follow_the_name_for_the_block() -> None:
    handlers = _registry()
    with topic_renamed(ORDERS) as name:
        assert name.startswith("orders.created-") and len(name) == len("orders.created") + 9
        assert ORDERS.name == name and ORDERS.declared_name == "orders.created"
        assert _sent_to(ORDERS) == name
        assert handlers.topics == sorted(["audit", name])
        spec = handlers.get(name)
        assert spec is not None and spec.topic == name and spec.declared is ORDERS
        assert handlers.get("orders.created") is None
        assert handlers.unordered_topics == [name]
        assert {s.topic for s in handlers} == {"audit", name}
    assert ORDERS.name == "orders.created"
    assert _sent_to(ORDERS) == "orders.created"
    assert handlers.topics == ["audit", "orders.created"]
    assert handlers.get("orders.created") is not None and handlers.get(name) is None


def test_the_name_comes_back_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError):
        with topic_renamed(ORDERS, "orders.created-1"):
            raise RuntimeError("the test failed")
    assert ORDERS.name == "orders.created"


def test_nested_blocks_give_back_the_enclosing_name() -> None:
    with topic_renamed(ORDERS, "outer"):
        with topic_renamed(ORDERS, "inner"):
            assert ORDERS.name == "inner"
        assert ORDERS.name == "outer"
    assert ORDERS.name == "orders.created"


def test_other_topics_and_copies_are_untouched() -> None:
    other = Topic("orders.paid", Order)
    copy = ORDERS.renamed("orders.copy")
    with topic_renamed(ORDERS, "orders.mine"):
        assert (other.name, copy.name) == ("orders.paid", "orders.copy")


def test_the_daemons_threads_see_the_name() -> None:
    seen: list[str] = []
    with topic_renamed(ORDERS, "orders.threaded"):
        thread = threading.Thread(target=lambda: seen.append(_registry().topics[1]))
        thread.start()
        thread.join()
    assert seen == ["orders.threaded"]


def test_a_registry_built_inside_the_block_is_keyed_by_the_declared_name_after() -> None:
    with topic_renamed(ORDERS, "orders.during") as name:
        handlers = _registry()
        assert handlers.topics == ["audit", name]
    assert handlers.topics == ["audit", "orders.created"]


def test_registries_merged_and_sent_topics_follow_too() -> None:
    merged = Handlers().include(_registry())
    merged.sends(ORDERS)
    with topic_renamed(ORDERS, "orders.merged"):
        assert "orders.merged" in merged.topics
        assert [t.name for t in merged.sent_topics] == ["orders.merged"]


def test_a_rename_onto_a_topic_another_handler_reads_is_a_conflict() -> None:
    handlers = _registry()
    with topic_renamed(ORDERS, "audit"):
        with pytest.raises(HandlerConflict, match="'audit' has two handlers"):
            handlers.get("audit")
    assert handlers.get("audit") is not None


def test_topic_renamed_takes_a_topic() -> None:
    with pytest.raises(TypeError, match=r"takes an outbox\.Topic"):
        with topic_renamed("orders.created"):  # type: ignore[arg-type]
            pass


def test_per_test_names_are_new_each_time_and_fit() -> None:
    assert per_test_name(ORDERS) != per_test_name(ORDERS)
    long = Topic("z" * 249, None)
    assert len(per_test_name(long)) == 249
    assert per_test_name("orders").startswith("orders-")
    with pytest.raises(InvalidTopic):
        per_test_name("not a topic")


USER_TESTS = """
from outbox import Topic

ORDERS = Topic("orders.created", None)


def test_first(outbox_rename_topic):
    name = outbox_rename_topic(ORDERS)
    assert ORDERS.name == name != "orders.created"
    assert outbox_rename_topic(ORDERS, "orders.chosen") == "orders.chosen" == ORDERS.name


def test_second_sees_the_declaration():
    assert ORDERS.name == "orders.created"
"""


def test_the_fixture_gives_the_name_back_for_the_next_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This checkout's outbox, whatever the subprocess's working directory.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)
