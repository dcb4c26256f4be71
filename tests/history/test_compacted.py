"""The compacted-topic check: each breach of what a compacted topic promises is found in a
hand-made history holding it, and a history compaction only thinned passes."""

from __future__ import annotations

from tests.history.compacted import KeyedSend, check_compacted
from tests.history.recorder import FAIL, INFO, OK


def ok(partition: int, record_key: str, value: int, offset: int) -> KeyedSend:
    return KeyedSend(partition, record_key, value, 0.0, 1.0, OK, offset)


SENDS = [ok(0, "a", 0, 0), ok(0, "b", 1, 1), ok(0, "a", 2, 2), ok(0, "b", 3, 3)]


def found(sends: list[KeyedSend], read: dict[int, list[tuple[int, str, int]]]) -> dict[str, int]:
    report = check_compacted(sends, read)
    return {kind: a["count"] for kind, a in report["anomalies"].items() if a["count"]}


def test_a_topic_thinned_by_compaction_is_valid() -> None:
    report = check_compacted(SENDS, {0: [(2, "a", 2), (3, "b", 3)]})
    assert report["valid"]
    assert report["removed_by_compaction"] == 2


def test_an_uncompacted_topic_is_valid() -> None:
    assert check_compacted(SENDS, {0: [(0, "a", 0), (1, "b", 1), (2, "a", 2), (3, "b", 3)]})[
        "valid"
    ]


def test_a_latest_record_removed_is_lost() -> None:
    assert found(SENDS, {0: [(1, "b", 1), (3, "b", 3)]}) == {"lost-latest": 1}


def test_a_latest_record_superseded_by_a_later_unknown_send_is_not_lost() -> None:
    sends = [*SENDS, KeyedSend(0, "a", 4, 0.0, 1.0, INFO)]
    assert found(sends, {0: [(3, "b", 3), (4, "a", 4)]}) == {}


def test_a_record_read_at_another_offset_moved() -> None:
    assert found(SENDS, {0: [(2, "a", 2), (4, "b", 3)]}) == {"moved": 1}


def test_a_value_never_sent_or_sent_under_another_key_is_a_phantom() -> None:
    read = {0: [(2, "a", 2), (3, "b", 3), (4, "a", 99), (5, "b", 0)]}
    assert found(SENDS, read) == {"phantom": 2}


def test_a_failed_send_read_is_a_phantom() -> None:
    sends = [*SENDS, KeyedSend(0, "c", 5, 0.0, 1.0, FAIL)]
    assert found(sends, {0: [(2, "a", 2), (3, "b", 3), (4, "c", 5)]}) == {"phantom": 1}


def test_a_value_read_twice_is_a_duplicate() -> None:
    assert found(SENDS, {0: [(2, "a", 2), (3, "b", 3), (3, "b", 3)]}) == {
        "duplicate": 1,
        "nonmonotonic": 1,
    }


def test_offsets_out_of_order_are_nonmonotonic() -> None:
    assert found(SENDS, {0: [(3, "b", 3), (2, "a", 2)]}) == {"nonmonotonic": 1}
