"""The history checker: each anomaly found in a small history made to hold it (and nothing
else), valid histories passing, malformed ones refused with the line named, and a large
generated history checked without recursion limits."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.history.__main__ import main
from tests.history.checker import Report, allowed_anomalies, check
from tests.history.cycles import Dependency, DependencyGraph, find_cycles
from tests.history.model import Event, HistoryError, Poll, Send, load, pair, parse_lines

X, Y = "orders/0", "orders/1"
POLL = ["poll"]


def send(key: str, value: int) -> list[Any]:
    return ["send", key, value]


def sent(key: str, offset: int | None, value: int) -> list[Any]:
    return ["send", key, [offset, value]]


def polled(records: dict[str, list[tuple[int, int]]]) -> list[Any]:
    return ["poll", {key: [list(r) for r in pairs] for key, pairs in records.items()}]


class History:
    """Writes a history line by line, as a driver would."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, process: int, kind: str, f: str, value: Any, **extra: Any) -> None:
        index = len(self.lines)
        event = {"index": index, "time": index / 100, "process": process, "type": kind, "f": f}
        self.lines.append(json.dumps({**event, "value": value, **extra}))

    def op(self, process: int, f: str, invoked: Any, kind: str, done: Any, **extra: Any) -> None:
        self.event(process, "invoke", f, invoked)
        self.event(process, kind, f, done, **extra)

    def sends(self, process: int, *records: tuple[str, int | None, int], kind: str = "ok") -> None:
        """A send of `(key, offset, value)` records; offsets None stay unknown."""
        invoked = [send(key, value) for key, _, value in records]
        done = [sent(key, offset, value) for key, offset, value in records]
        self.op(process, "send", invoked, kind, done)

    def poll(self, process: int, records: dict[str, list[tuple[int, int]]], **extra: Any) -> None:
        self.op(process, "poll", [POLL], "ok", [polled(records)], **extra)

    def txn(self, process: int, invoked: list[Any], kind: str, done: Any) -> None:
        self.op(process, "txn", invoked, kind, done)

    def assign(self, process: int, keys: list[str]) -> None:
        self.op(process, "assign", keys, "ok", keys)

    def check(self, **options: Any) -> Report:
        return check(pair(parse_lines(self.lines)), **options)


def anomalies(report: Report) -> set[str]:
    return set(report.anomaly_types)


# Each anomaly, alone in a history made to hold it -----------------------------------------


def test_a_write_below_what_was_read_and_never_read_is_lost() -> None:
    # p0 crashes sending a to x and b to y at offset 0; a was read, so p0 committed. c is read
    # at offset 1 of y, so b (at 0) should have been read too.
    h = History()
    h.op(0, "send", [send(X, 1), send(Y, 2)], "info", [send(X, 1), sent(Y, 0, 2)])
    h.sends(1, (Y, None, 3), kind="info")
    h.poll(2, {X: [(0, 1)]})
    h.poll(3, {Y: [(1, 3)]})
    report = h.check()
    assert anomalies(report) == {"lost-write"}
    assert not report.valid
    [lost] = report.examples["lost-write"]
    assert (lost["key"], lost["value"], lost["index"], lost["max_read_index"]) == (Y, 2, 0, 1)
    assert lost["writer"]["process"] == 0
    assert lost["max_read"]["process"] == 3


def test_a_crashed_write_nothing_proves_committed_is_not_lost() -> None:
    h = History()
    h.op(0, "send", [send(X, 1), send(Y, 2)], "info", [send(X, 1), sent(Y, 0, 2)])
    h.sends(1, (Y, None, 3), kind="info")
    h.poll(3, {Y: [(1, 3)]})
    assert anomalies(h.check()) == set()


def test_an_acknowledged_write_skipped_by_the_reads_is_lost_and_unseen() -> None:
    h = History()
    h.sends(0, (X, 0, 1))
    h.sends(0, (X, 1, 2), (X, 3, 4))
    h.sends(1, (X, None, 3), kind="info")
    h.poll(2, {X: [(2, 3)]})
    report = h.check()
    # Jepsen's example: 1 and 2 are below the read of 3, 4 is above it (and 3 landing
    # between 2 and 4 is an allowed int-send-skip).
    assert report.forbidden == ["lost-write", "unseen"]
    assert [e["value"] for e in report.examples["lost-write"]] == [1, 2]
    assert sorted(e["value"] for e in report.examples["unseen"]) == [1, 2, 4]


def test_an_acknowledged_write_no_one_read_is_unseen() -> None:
    h = History()
    h.sends(0, (X, 0, 1), (X, 1, 2))
    h.poll(1, {X: [(0, 1)]})
    report = h.check()
    assert anomalies(report) == {"unseen"}
    assert report.examples["unseen"] == [
        {"key": X, "value": 2, "offset": 1, "writer": report.examples["unseen"][0]["writer"]}
    ]
    assert not report.valid


def test_a_value_at_two_offsets_is_a_duplicate() -> None:
    h = History()
    h.sends(0, (X, 1, 1))
    h.sends(1, (X, None, 2), kind="info")
    h.poll(2, {X: [(2, 2), (3, 1)]})
    report = h.check()
    # 1 both before and after 2 in x's version order is a write cycle too (allowed).
    assert anomalies(report) == {"duplicate", "G0"}
    assert report.forbidden == ["duplicate"]
    assert report.examples["duplicate"] == [{"key": X, "value": 1, "count": 2, "offsets": [1, 3]}]


def test_two_values_at_one_offset_are_inconsistent_offsets() -> None:
    h = History()
    h.sends(0, (X, 0, 1))
    h.sends(1, (X, 0, 2))
    h.poll(2, {X: [(0, 1)]})
    h.poll(3, {X: [(0, 2)]})
    report = h.check()
    assert anomalies(report) == {"inconsistent-offsets"}
    assert report.examples["inconsistent-offsets"] == [
        {"key": X, "offset": 0, "index": 0, "values": [1, 2]}
    ]


def test_a_crashed_send_s_offset_counts_once_it_is_proven_committed() -> None:
    h = History()
    h.op(0, "send", [send(X, 1), send(Y, 1)], "info", [sent(X, 0, 1), send(Y, 1)])
    h.sends(1, (X, 0, 2))
    h.poll(2, {X: [(0, 2)]})
    assert anomalies(h.check()) == set()
    # A read of its y value proves p0's send happened: it and p1's both claim x's offset 0,
    # and no one read p0's.
    h.poll(3, {Y: [(5, 1)]})
    assert anomalies(h.check()) == {"inconsistent-offsets", "lost-write"}


def test_reading_a_failed_write_is_an_aborted_read() -> None:
    h = History()
    h.op(0, "send", [send(X, 2), send(Y, 3)], "fail", [send(X, 2), send(Y, 3)])
    h.poll(1, {X: [(0, 2)]})
    report = h.check()
    assert anomalies(report) == {"G1a"}
    [case] = report.examples["G1a"]
    assert (case["key"], case["value"], case["writer"]["type"], case["reader"]["process"]) == (
        X,
        2,
        "fail",
        1,
    )


def test_a_transaction_reading_its_own_send_is_a_precommitted_read() -> None:
    h = History()
    h.txn(0, [send(X, 1), POLL], "ok", [sent(X, 0, 1), polled({X: [(0, 1)]})])
    h.poll(1, {X: [(0, 1)]})
    report = h.check()
    assert anomalies(report) == {"precommitted-read"}
    assert report.examples["precommitted-read"][0]["value"] == 1


def test_a_value_nobody_sent_is_a_garbage_read() -> None:
    h = History()
    h.sends(0, (Y, 0, 1))
    h.poll(1, {Y: [(0, 1)], X: [(0, 99)]})
    report = h.check()
    assert anomalies(report) == {"garbage-read"}
    assert report.examples["garbage-read"][0]["value"] == 99


def test_a_process_s_next_poll_skipping_known_values_is_a_poll_skip() -> None:
    # Jepsen's example: p0 reads 1, 2, then 4 (3 was read by p1), then 7 (6 was sent).
    h = History()
    h.poll(0, {X: [(1, 1), (2, 2)]})
    h.poll(1, {X: [(3, 3)]})
    h.poll(0, {X: [(4, 4)]})
    h.sends(2, (X, 6, 6))
    h.poll(4, {X: [(6, 6)]})
    h.poll(0, {X: [(7, 7)]})
    h.op(3, "send", [send(X, v) for v in (1, 2, 3, 4)], "info", None)
    h.op(5, "send", [send(X, 7)], "info", None)
    report = h.check()
    assert anomalies(report) == {"poll-skip"}
    assert [(e["values"], e["delta"], e["skipped"]) for e in report.examples["poll-skip"]] == [
        ([2, 4], 2, [3]),
        ([4, 7], 2, [6]),
    ]


def test_polls_with_an_assign_between_them_are_not_compared() -> None:
    h = History()
    h.poll(0, {X: [(1, 1), (2, 2)]})
    h.poll(1, {X: [(3, 3)]})
    h.assign(0, [X, Y])
    h.poll(0, {X: [(4, 4)]})
    h.assign(0, [X])
    h.poll(0, {X: [(1, 1)]})
    h.op(3, "send", [send(X, v) for v in (1, 2, 3, 4)], "info", None)
    assert anomalies(h.check()) == set()


def test_a_process_s_next_poll_going_back_is_a_nonmonotonic_poll() -> None:
    h = History()
    h.sends(0, (X, 1, 1), (X, 2, 2), (X, 3, 3), (X, 4, 4))
    h.poll(0, {X: [(1, 1), (2, 2), (3, 3)]})
    h.poll(0, {X: [(2, 2), (3, 3), (4, 4)]})
    report = h.check()
    assert anomalies(report) == {"nonmonotonic-poll"}
    [case] = report.examples["nonmonotonic-poll"]
    assert (case["values"], case["delta"]) == ([3, 2], -1)


def test_a_key_rebalanced_during_a_poll_is_not_compared() -> None:
    h = History()
    h.sends(0, (X, 1, 1), (X, 2, 2), (X, 3, 3), (X, 4, 4))
    h.poll(0, {X: [(1, 1), (2, 2), (3, 3)]})
    h.poll(0, {X: [(2, 2), (3, 3), (4, 4)]}, rebalanced=[X])
    assert anomalies(h.check()) == set()


def test_a_failed_transaction_s_polls_move_the_process_s_position() -> None:
    # Kafka does not rewind a consumer when its transaction aborts: the next poll goes on
    # after the records the aborted one polled.
    h = History()
    h.sends(0, (X, 0, 1), (X, 1, 2), (X, 2, 3))
    h.poll(1, {X: [(0, 1)]})
    h.txn(1, [POLL, send(Y, 9)], "fail", [polled({X: [(1, 2)]}), sent(Y, 0, 9)])
    h.poll(1, {X: [(2, 3)]})
    h.poll(2, {X: [(1, 2)]})
    assert anomalies(h.check()) == set()
    # A failed operation whose polls' results are unknown leaves the position unknown.
    h = History()
    h.sends(0, (X, 0, 1), (X, 1, 2), (X, 2, 3))
    h.poll(1, {X: [(0, 1)]})
    h.txn(1, [POLL, send(Y, 9)], "fail", None)
    h.poll(1, {X: [(2, 3)]})
    h.poll(2, {X: [(1, 2)]})
    assert anomalies(h.check()) == set()


def test_one_operation_s_polls_skipping_known_values_are_an_int_poll_skip() -> None:
    h = History()
    h.op(1, "send", [send(X, 1), send(X, 2), send(X, 4)], "info", None)
    h.poll(0, {X: [(1, 1), (4, 4)]})
    h.op(3, "poll", [POLL, POLL], "ok", [polled({X: [(1, 1)]}), polled({X: [(4, 4)]})])
    h.poll(2, {X: [(2, 2)]})
    report = h.check()
    assert anomalies(report) == {"int-poll-skip"}
    assert report.counts["int-poll-skip"] == 2
    assert {
        (e["op"]["process"], e["delta"], tuple(e["skipped"]))
        for e in report.examples["int-poll-skip"]
    } == {
        (0, 2, (2,)),
        (3, 2, (2,)),
    }


def test_one_operation_s_polls_going_back_are_an_int_nonmonotonic_poll() -> None:
    h = History()
    h.op(1, "send", [send(X, 1), send(X, 2), send(X, 3)], "info", None)
    h.poll(0, {X: [(3, 3), (1, 1)]})
    h.op(2, "poll", [POLL, POLL], "ok", [polled({X: [(2, 2), (3, 3)]}), polled({X: [(3, 3)]})])
    report = h.check()
    assert anomalies(report) == {"int-nonmonotonic-poll"}
    assert [(e["values"], e["delta"]) for e in report.examples["int-nonmonotonic-poll"]] == [
        ([3, 1], -2),
        ([3, 3], 0),
    ]


def test_a_process_s_next_send_landing_earlier_is_a_nonmonotonic_send() -> None:
    h = History()
    h.sends(0, (X, 3, 3), (X, 4, 4))
    h.sends(0, (X, 1, 1), (X, 2, 2))
    h.poll(1, {X: [(1, 1), (2, 2), (3, 3), (4, 4)]})
    report = h.check()
    assert anomalies(report) == {"nonmonotonic-send"}
    [case] = report.examples["nonmonotonic-send"]
    assert (case["values"], case["delta"]) == ([4, 1], -3)


def test_one_operation_s_sends_landing_in_reverse_are_an_int_nonmonotonic_send() -> None:
    h = History()
    h.sends(0, (X, 3, 3), (X, 1, 1))
    h.poll(1, {X: [(1, 1), (3, 3)]})
    report = h.check()
    assert anomalies(report) == {"int-nonmonotonic-send"}
    assert report.examples["int-nonmonotonic-send"][0]["delta"] == -1


def test_interleaved_sends_of_one_operation_are_an_allowed_int_send_skip() -> None:
    # Another producer's record lands between p0's two: Kafka allows it, and the two
    # operations' writes then form a write cycle (G0), allowed as well.
    h = History()
    h.event(0, "invoke", "send", [send(X, 1), send(X, 3)])
    h.event(1, "invoke", "send", [send(X, 2)])
    h.event(0, "ok", "send", [sent(X, 1, 1), sent(X, 3, 3)])
    h.event(1, "info", "send", None, error="timeout")
    h.poll(2, {X: [(1, 1), (2, 2), (3, 3)]})
    report = h.check()
    assert anomalies(report) == {"int-send-skip", "G0"}
    assert report.examples["int-send-skip"][0]["skipped"] == [2]
    assert report.valid


def test_a_write_cycle_is_g0_and_allowed() -> None:
    h = History()
    h.event(0, "invoke", "send", [send(X, 1), send(Y, 1)])
    h.event(1, "invoke", "send", [send(X, 2), send(Y, 2)])
    h.event(0, "ok", "send", [sent(X, 0, 1), sent(Y, 1, 1)])
    h.event(1, "ok", "send", [sent(X, 1, 2), sent(Y, 0, 2)])
    h.poll(2, {X: [(0, 1), (1, 2)], Y: [(0, 2), (1, 1)]})
    report = h.check()
    assert anomalies(report) == {"G0"}
    assert report.valid
    [cycle] = report.examples["G0"]
    assert [op["process"] for op in cycle["cycle"]] in ([0, 1, 0], [1, 0, 1])
    assert {(s["type"], s["key"]) for s in cycle["steps"]} == {("ww", X), ("ww", Y)}
    assert anomalies(h.check(ww_deps=False)) == set()


def _pure_wr_cycle() -> History:
    # Each transaction polls the other's send: impossible if neither shows uncommitted data.
    h = History()
    h.event(0, "invoke", "txn", [send(X, 1), POLL])
    h.event(1, "invoke", "txn", [send(Y, 2), POLL])
    h.event(0, "ok", "txn", [sent(X, 0, 1), polled({Y: [(0, 2)]})])
    h.event(1, "ok", "txn", [sent(Y, 0, 2), polled({X: [(0, 1)]})])
    return h


def test_a_read_cycle_is_g1c_forbidden_without_ww_dependencies() -> None:
    report = _pure_wr_cycle().check(ww_deps=False)
    assert anomalies(report) == {"G1c"}
    assert report.forbidden == ["G1c"]
    [cycle] = report.examples["G1c"]
    assert [s["type"] for s in cycle["steps"]] == ["wr", "wr"]
    assert [op["process"] for op in cycle["cycle"]] in ([0, 1, 0], [1, 0, 1])
    # With ww dependencies inferred (Jepsen's default), G1c is expected in Kafka.
    report = _pure_wr_cycle().check()
    assert anomalies(report) == {"G1c"}
    assert report.valid


def test_a_cycle_of_write_and_read_dependencies_is_g1c() -> None:
    # t1 sends y=3 after t2's y=2, and t2 polled t1's x=1.
    h = History()
    h.event(0, "invoke", "txn", [send(X, 1), send(Y, 3)])
    h.event(1, "invoke", "txn", [POLL, send(Y, 2)])
    h.event(0, "ok", "txn", [sent(X, 0, 1), sent(Y, 2, 3)])
    h.event(1, "ok", "txn", [polled({X: [(0, 1)]}), sent(Y, 1, 2)])
    h.poll(2, {Y: [(1, 2), (2, 3)]})
    report = h.check()
    assert anomalies(report) == {"G1c"}
    [cycle] = report.examples["G1c"]
    assert sorted(s["type"] for s in cycle["steps"]) == ["wr", "ww"]
    assert anomalies(h.check(ww_deps=False)) == set()


def test_a_history_with_nothing_to_check_is_an_empty_transaction_graph() -> None:
    h = History()
    h.assign(0, [X])
    report = h.check()
    assert anomalies(report) == {"empty-transaction-graph"}
    assert not report.valid


def test_allowed_anomalies_are_jepsen_s() -> None:
    assert allowed_anomalies(ww_deps=True) == {"int-send-skip", "G0", "G1c"}
    assert allowed_anomalies(ww_deps=False) == {"int-send-skip", "G0"}


# Valid histories ---------------------------------------------------------------------------


def _valid_history() -> History:
    """Six clients, transactions and plain sends overlapping, an aborted transaction, crashed
    sends that landed and one that did not, offsets with gaps from transaction markers and
    aborted records, a consumer sent back to the start, and final polls that read it all."""
    h = History()
    h.assign(0, [X, Y])
    h.event(1, "invoke", "send", [send(X, 1)])
    h.event(2, "invoke", "txn", [send(X, 10), send(Y, 20), POLL])
    h.event(1, "ok", "send", [sent(X, 0, 1)])
    # Committed: its markers take x's offset 2 and y's offset 1.
    h.event(2, "ok", "txn", [sent(X, 1, 10), sent(Y, 0, 20), polled({})])
    # Aborted: 11 takes x's offset 3 and is never seen; its marker takes 4.
    h.txn(3, [send(X, 11)], "fail", [sent(X, 3, 11)])
    h.event(4, "invoke", "send", [send(Y, 21)])
    h.event(5, "invoke", "send", [send(Y, 22)])
    h.sends(1, (X, 5, 2))
    h.event(0, "invoke", "poll", [POLL])
    h.event(4, "info", "send", None, error="timed out")  # landed at y's offset 2
    h.event(5, "info", "send", [send(Y, 22)], error="timed out")  # never landed
    h.event(0, "ok", "poll", [polled({X: [(0, 1), (1, 10)], Y: [(0, 20)]})])
    h.poll(0, {X: [(5, 2)], Y: [(2, 21)]})
    h.txn(
        6,
        [POLL, send(Y, 23)],
        "ok",
        [polled({X: [(0, 1), (1, 10), (5, 2)]}), sent(Y, 3, 23)],
    )
    h.assign(0, [X])  # seek back to the beginning
    h.poll(0, {X: [(0, 1)]})
    h.op(0, "commit", {X: 1}, "ok", {X: 1})
    h.poll(0, {X: [(1, 10), (5, 2)]})
    h.assign(7, [X, Y])
    h.poll(7, {X: [(0, 1), (1, 10), (5, 2)], Y: [(0, 20), (2, 21), (3, 23)]})
    h.event(8, "invoke", "send", [send(X, 3)])  # still outstanding when the run ended
    return h


def test_a_valid_history_has_no_anomaly() -> None:
    for ww_deps in (True, False):
        report = _valid_history().check(ww_deps=ww_deps)
        assert report.anomaly_types == []
        assert report.valid
    stats = report.stats
    assert stats["operations"]["send"] == {"ok": 2, "info": 3}
    assert stats["operations"]["txn"] == {"ok": 2, "fail": 1}
    assert stats["unfinished"] == 1
    assert (stats["acknowledged_writes"], stats["values_read"], stats["keys"]) == (5, 6, 2)
    assert json.loads(json.dumps(report.to_dict()))["valid"] is True


def test_examples_are_bounded_and_counts_are_not() -> None:
    h = History()
    h.sends(0, *[(X, n, n) for n in range(50)])
    h.poll(1, {X: [(0, 0)]})
    report = h.check(max_examples=3)
    assert report.counts["unseen"] == 49
    assert len(report.examples["unseen"]) == 3
    assert "unseen: 49 (forbidden)" in report.summary()
    report = h.check(max_examples=0)
    assert report.to_dict()["anomalies"]["unseen"] == {
        "count": 49,
        "allowed": False,
        "examples": [],
    }
    assert "unseen: 49 (forbidden)" in report.summary()


# Malformed histories -------------------------------------------------------------------------


def _event(**fields: Any) -> str:
    base = {"index": 0, "time": 0.5, "process": 0, "type": "invoke", "f": "poll", "value": [POLL]}
    return json.dumps({**base, **fields})


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "an event is a JSON object"),
        ('{"index": 0}', "missing field 'time'"),
        (_event(type="done"), "type must be one of invoke, ok, fail, info"),
        (_event(f="produce"), "f must be one of"),
        (_event(index=True), "index must be an integer >= 0"),
        (_event(time=float("nan")), "NaN is not valid JSON"),
        (_event(time=-1), "time must be a number"),
        (_event(value=None), "an invoke poll needs a value"),
        (_event(value=[["poll", {}]]), "a poll is"),
        (_event(f="send", value=[["send", X, "one"]]), "value must be an integer"),
        (_event(f="send", value=[["send", 7, 1]]), "a key is a non-empty string"),
        (_event(f="send", value=[POLL]), "a send holds only send micro-ops"),
        (_event(f="txn", value=[]), "non-empty list of micro-ops"),
        (_event(f="assign", value="orders/0"), "is a list of keys"),
        (_event(type="ok", value=[POLL]), "an ok poll is"),
        (_event(type="ok", value=[["poll", {X: [[0]]}]]), "is [offset >= 0, value], not [0]"),
        (
            _event(type="ok", value=[["poll", {X: [[-1, 5]]}]]),
            "is [offset >= 0, value], not [-1, 5]",
        ),
        (_event(type="ok", value=[["poll", {X: [[0, True]]}]]), "not [0, true]"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_a_malformed_line_is_refused_naming_it(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(_event(process=9) + "\n\n" + line + "\n")
    with pytest.raises(HistoryError) as refused:
        load(path)
    message = str(refused.value)
    assert message.startswith(f"{path}:3: ")
    assert problem in message
    assert "\n" not in message


def test_a_line_that_is_not_utf8_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    path.write_bytes(
        _event().encode() + b"\n" + _event(index=1, type="fail").encode() + b"\n\xff\n"
    )
    with pytest.raises(HistoryError, match=r":3: not UTF-8 text"):
        load(path)


@pytest.mark.parametrize(
    ("events", "problem"),
    [
        ([_event(type="ok", value=[["poll", {}]])], "which has no operation outstanding"),
        ([_event(), _event(index=1)], "still has the operation of line 1 outstanding"),
        (
            [_event(), _event(index=1, type="info"), _event(index=2)],
            "process 0 crashed (line 2)",
        ),
        ([_event(), _event(index=0, type="fail")], "index 0 does not follow index 0"),
        ([_event(), _event(index=1, type="fail", f="send", value=None)], "completes a send"),
        (
            [
                _event(f="send", value=[["send", X, 1]]),
                _event(index=1, type="ok", f="send", value=[["send", X, [0, 2]]]),
            ],
            "reports another key or value than was sent",
        ),
        (
            [
                _event(f="txn", value=[["send", X, 1]]),
                _event(index=1, type="ok", f="txn", value=[["send", X, [0, 1]], ["poll", {}]]),
            ],
            "2 micro-ops where the invocation has 1",
        ),
        (
            [
                _event(f="send", value=[["send", X, 1]]),
                _event(index=1, type="fail", f="send", value=None),
                _event(index=2, process=1, f="send", value=[["send", X, 1]]),
            ],
            "value 1 is sent to 'orders/0' again (first at line 1)",
        ),
        ([_event(f="send", value=[["send", X, 1]] * 2)], "twice in one operation"),
    ],
)
def test_a_history_breaking_the_rules_is_refused_naming_the_line(
    events: list[str], problem: str
) -> None:
    with pytest.raises(HistoryError) as refused:
        pair(parse_lines(events, source="run.jsonl"), source="run.jsonl")
    assert f"run.jsonl:{len(events)}: " in str(refused.value)
    assert problem in str(refused.value)


def test_the_command_line_exits_by_the_worst_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    valid, invalid, malformed = (tmp_path / n for n in ("valid", "invalid", "malformed"))
    valid.write_text("\n".join(_valid_history().lines) + "\n")
    h = History()
    h.sends(0, (X, 0, 1), (X, 1, 2))
    h.poll(1, {X: [(0, 1)]})
    invalid.write_text("\n".join(h.lines) + "\n")
    malformed.write_text("{\n")
    assert main([str(valid)]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    assert main([str(valid), str(invalid), "--summary"]) == 1
    out = capsys.readouterr().out
    assert f"{invalid}: INVALID: unseen" in out
    assert f"{valid}: valid" in out
    assert main([str(invalid), str(malformed)]) == 2
    assert f"{malformed}:1: not JSON" in capsys.readouterr().err


# Scale ---------------------------------------------------------------------------------------


def test_a_cycle_through_a_hundred_thousand_operations_is_found_without_recursion() -> None:
    graph = DependencyGraph()
    size = 100_000
    for node in range(size):
        graph.add(node, (node + 1) % size, Dependency("ww", X, node, node + 1))
    graph.add(5, 7, Dependency("wr", Y, 5))
    cycles = {cycle.anomaly: cycle for cycle in find_cycles(graph)}
    assert len(cycles["G0"].nodes) == size + 1
    assert cycles["G1c"].nodes[:2] == (5, 7)
    assert cycles["G1c"].nodes[-1] == 5
    assert len(cycles["G1c"].nodes) == size


def _generated_history(operations: int, seed: int) -> list[Event]:
    """A run against a correct Kafka: clients send, poll and run transactions (some abort,
    some crash, landing or not) one at a time, consumers are reassigned and moved, and a last
    client reads every key from the start. Built as events directly: parsing is tested above,
    and JSON would take most of the time."""
    rng = random.Random(seed)
    keys = [f"t/{n}" for n in range(8)]
    # Per key, each offset's record: (value, visible); markers and aborted records invisible.
    logs: dict[str, list[tuple[int, bool]]] = {key: [] for key in keys}
    values = dict.fromkeys(keys, 0)
    events: list[Event] = []
    processes = list(range(6))
    positions: dict[int, dict[str, int]] = {p: {} for p in processes}
    new_process = len(processes)

    def emit(process: int, kind: str, f: str, mops: Any = None, assigned: Any = None) -> None:
        index = len(events)
        events.append(Event(index, index / 1000, process, kind, f, mops=mops, keys=assigned))

    def consume(process: int, limit: int) -> Poll:
        records: dict[str, list[tuple[int, int]]] = {}
        for key, position in positions[process].items():
            log = logs[key]
            while position < len(log) and len(records.get(key, ())) < limit:
                value, visible = log[position]
                if visible:
                    records.setdefault(key, []).append((position, value))
                position += 1
            positions[process][key] = position
        return Poll({key: tuple(pairs) for key, pairs in records.items()})

    def some_keys(most: int) -> list[str]:
        first = int(rng.random() * len(keys))
        return (keys * 2)[first : first + 1 + int(rng.random() * most)]

    def append(key: str, visible: bool) -> Send:
        values[key] += 1
        logs[key].append((values[key], visible))
        return Send(key, values[key], len(logs[key]) - 1)

    for _ in range(operations):
        process = rng.choice(processes)
        roll = rng.random()
        outcome = "ok"
        if roll < 0.35:
            chosen = some_keys(3)
            emit(process, "invoke", "send", tuple(Send(k, values[k] + 1) for k in chosen))
            outcome = "info" if rng.random() < 0.03 else "ok"
            if outcome == "ok" or rng.random() < 0.5:  # landed
                emit(process, outcome, "send", tuple(append(k, True) for k in chosen))
            else:
                for k in chosen:
                    values[k] += 1
                emit(process, outcome, "send")
        elif roll < 0.55:
            chosen = some_keys(2)
            emit(process, "invoke", "txn", (Poll(), *(Send(k, values[k] + 1) for k in chosen)))
            outcome = "ok" if roll < 0.52 else "fail" if roll < 0.545 else "info"
            commits = outcome == "ok" or (outcome == "info" and rng.random() < 0.5)
            done = (consume(process, 2), *(append(k, commits) for k in chosen))
            for k in chosen:
                append(k, False)  # the transaction's marker
            emit(process, outcome, "txn", done if outcome != "info" else None)
        elif roll < 0.95:
            emit(process, "invoke", "poll", (Poll(),))
            emit(process, "ok", "poll", (consume(process, 1 + int(rng.random() * 4)),))
        else:
            chosen = some_keys(3)
            emit(process, "invoke", "assign", assigned=tuple(chosen))
            positions[process] = {k: int(rng.random() * (len(logs[k]) + 1)) for k in chosen}
            emit(process, "ok", "assign", assigned=tuple(chosen))
        if outcome == "info":
            processes[processes.index(process)] = new_process
            positions[new_process] = {}
            new_process += 1
    emit(new_process, "invoke", "assign", assigned=tuple(keys))
    positions[new_process] = dict.fromkeys(keys, 0)
    emit(new_process, "ok", "assign", assigned=tuple(keys))
    emit(new_process, "invoke", "poll", (Poll(),))
    emit(new_process, "ok", "poll", (consume(new_process, 10**9),))
    return events


def test_a_generated_history_of_100k_events_is_checked_whole_and_valid() -> None:
    # 50,000 operations, 100,000 lines; per key, chains of ww dependencies thousands long.
    events = _generated_history(50_000, seed=7)
    assert len(events) > 100_000
    report = check(pair(events))
    assert report.anomaly_types == []
    assert report.stats["operations"]["txn"]["fail"] > 1000
    assert report.stats["dependencies"]["ww"] > 40_000
