"""The Kafka subscriber's offset continuity check (outbox.kafka.continuity), on plain records."""

from __future__ import annotations

from dataclasses import dataclass

from outbox.kafka.continuity import Continuity


@dataclass
class Rec:
    t: str
    p: int
    o: int

    def topic(self) -> str:
        return self.t

    def partition(self) -> int:
        return self.p

    def offset(self) -> int:
        return self.o


def recs(*pairs: tuple[int, int]) -> list[Rec]:
    return [Rec("t", p, o) for p, o in pairs]


def offsets(records: list[Rec]) -> list[tuple[int, int]]:
    return [(r.p, r.o) for r in records]


def test_records_that_follow_on_are_all_kept() -> None:
    c = Continuity()
    c.start(("t", 0), 5)
    kept, seek = c.admit(recs((0, 5), (0, 6), (0, 7)))
    assert offsets(kept) == [(0, 5), (0, 6), (0, 7)] and seek == {}
    kept, seek = c.admit(recs((0, 8)))
    assert offsets(kept) == [(0, 8)] and seek == {}


def test_a_jump_seeks_back_and_drops_only_that_partitions_later_records() -> None:
    c = Continuity()
    c.start(("t", 0), 0)
    c.start(("t", 1), 0)
    kept, seek = c.admit(recs((0, 0), (1, 0), (0, 2), (1, 1), (0, 3)))
    assert offsets(kept) == [(0, 0), (1, 0), (1, 1)]
    assert seek == {("t", 0): 1}


def test_the_missing_record_on_the_second_read_counts_as_skipped_by_the_broker() -> None:
    c = Continuity()
    c.start(("t", 0), 10)
    assert c.admit(recs((0, 11)))[1] == {("t", 0): 10}
    kept, seek = c.admit(recs((0, 10), (0, 11)))
    assert offsets(kept) == [(0, 10), (0, 11)] and seek == {}
    assert (c.skipped, c.holes) == (1, 0)


def test_the_same_jump_read_three_times_is_a_hole_of_the_log_and_is_accepted() -> None:
    c = Continuity()
    c.start(("t", 0), 10)
    assert c.admit(recs((0, 12)))[1] == {("t", 0): 10}
    assert c.admit(recs((0, 12), (0, 13)))[1] == {("t", 0): 10}, "read a third time"
    kept, seek = c.admit(recs((0, 12), (0, 13)))
    assert offsets(kept) == [(0, 12), (0, 13)] and seek == {}
    assert (c.skipped, c.holes) == (0, 1)
    # the next jump is read again too
    assert c.admit(recs((0, 20)))[1] == {("t", 0): 14}


def test_the_first_record_of_an_unknown_start_sets_the_expectation() -> None:
    c = Continuity()
    c.start(("t", 0), -1001)  # no committed offset: the client's reset policy decides
    kept, seek = c.admit(recs((0, 40), (0, 41)))
    assert offsets(kept) == [(0, 40), (0, 41)] and seek == {}
    assert c.admit(recs((0, 43)))[1] == {("t", 0): 42}


def test_a_partition_forgotten_at_revocation_starts_afresh() -> None:
    c = Continuity()
    c.start(("t", 0), 0)
    c.admit(recs((0, 0), (0, 5)))  # a jump: rereading from 1
    c.forget([("t", 0)])
    kept, seek = c.admit(recs((0, 100)))  # another owner moved on; assigned again
    assert offsets(kept) == [(0, 100)] and seek == {}


def test_a_record_delivered_again_is_dropped_and_does_not_move_the_expectation_back() -> None:
    c = Continuity()
    c.start(("t", 0), 1)
    kept, seek = c.admit(recs((0, 0), (0, 1), (0, 2), (0, 2), (0, 1), (0, 3)))
    assert offsets(kept) == [(0, 1), (0, 2), (0, 3)] and seek == {}
    assert c.admit(recs((0, 5)))[1] == {("t", 0): 4}


def test_a_partition_read_again_waits_for_its_record_while_others_flow() -> None:
    c = Continuity()
    c.start(("t", 0), 0)
    c.start(("t", 1), 0)
    assert c.admit(recs((0, 0), (0, 2)))[1] == {("t", 0): 1}
    kept, seek = c.admit(recs((1, 0), (1, 1)))
    assert offsets(kept) == [(1, 0), (1, 1)] and seek == {}
    kept, seek = c.admit(recs((0, 1), (0, 2)))
    assert offsets(kept) == [(0, 1), (0, 2)] and seek == {}
    assert (c.skipped, c.holes) == (1, 0)
