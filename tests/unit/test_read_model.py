"""The model the read chaos checks consumers against (tests/support/read_model.py): what it
lets a read miss, and what it flags."""

from __future__ import annotations

from tests.support.read_model import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Model,
    Outcome,
    Transaction,
)

NOW = 1_750_000_000_000
DAY = 86_400_000


def model(*, compacted: bool = True, retention: int = DAY) -> Model:
    m = Model()
    m.add_partition("t/0", compacted=compacted, delete_retention_ms=retention)
    return m


def write(
    m: Model,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    transaction: Transaction | None = None,
    timestamp: int = NOW,
) -> None:
    m.will_write("t/0", transaction)
    m.written("t/0", offset, key, value, timestamp, transaction)


def test_a_read_missing_a_committed_record_is_flagged() -> None:
    m = model()
    txn = Transaction("t1")
    write(m, 0, b"a", b"1", txn)
    m.decided(txn, Outcome.COMMITTED)  # marker at 1
    write(m, 2, b"b", b"2")
    assert m.check("t/0", READ_COMMITTED, 0, 3, [(2, b"b", b"2")]) == [
        "offset 0 missing: b'a'=b'1' (committed in t1)"
    ]
    assert m.check("t/0", READ_COMMITTED, 0, 3, [(0, b"a", b"1"), (2, b"b", b"2")]) == []


def test_aborted_and_open_records_are_never_read_committed() -> None:
    m = model()
    aborted, still_open = Transaction("t1"), Transaction("t2")
    write(m, 0, b"a", b"x", aborted)
    m.decided(aborted, Outcome.ABORTED)  # marker at 1
    write(m, 2, b"b", b"y", still_open)
    assert m.partitions["t/0"].stable_offset() == 2
    assert m.check("t/0", READ_COMMITTED, 0, 2, []) == []
    assert m.check("t/0", READ_COMMITTED, 0, 2, [(0, b"a", b"x")]) == [
        "offset 0: a record of an aborted transaction"
    ]
    assert "the read ended at 3, not at 2" in m.check("t/0", READ_COMMITTED, 0, 3, [])
    # read_uncommitted sees the open transaction's record; the aborted one it may miss.
    assert m.check("t/0", READ_UNCOMMITTED, 0, 3, [(2, b"b", b"y")]) == []
    assert m.check("t/0", READ_UNCOMMITTED, 0, 3, []) == [
        "offset 2 missing: b'b'=b'y' (open in t2)"
    ]


def test_a_replaced_record_may_go_only_after_a_cleaning_saw_its_replacement() -> None:
    m = model()
    write(m, 0, b"a", b"old")
    write(m, 1, b"a", b"new")
    assert m.check("t/0", READ_UNCOMMITTED, 0, 2, [(1, b"a", b"new")]) == [
        "offset 0 missing: b'a'=b'old' (plain)"
    ]
    m.cleaned("t/0", NOW)
    assert m.check("t/0", READ_UNCOMMITTED, 0, 2, [(1, b"a", b"new")]) == []
    plain = model(compacted=False)
    write(plain, 0, b"a", b"old")
    write(plain, 1, b"a", b"new")
    plain.cleaned("t/0", NOW)
    assert plain.check("t/0", READ_UNCOMMITTED, 0, 2, [(1, b"a", b"new")]) != []


def test_only_a_decided_record_replaces_another() -> None:
    m = model()
    write(m, 0, b"a", b"old")
    txn = Transaction("t1")
    write(m, 1, b"a", b"new", txn)
    m.cleaned("t/0", NOW)  # before the transaction committed: it replaced nothing then
    m.decided(txn, Outcome.COMMITTED)
    assert m.check("t/0", READ_COMMITTED, 0, 3, [(1, b"a", b"new")]) == [
        "offset 0 missing: b'a'=b'old' (plain)"
    ]


def test_a_tombstone_goes_once_a_cleaning_ran_past_its_retention() -> None:
    m = model(retention=1000)
    write(m, 0, b"a", None, timestamp=NOW)
    m.cleaned("t/0", NOW + 1000)
    assert m.check("t/0", READ_UNCOMMITTED, 0, 1, []) == ["offset 0 missing: b'a'=None (plain)"]
    m.cleaned("t/0", NOW + 1001)
    assert m.check("t/0", READ_UNCOMMITTED, 0, 1, []) == []


def test_what_was_never_written_there_is_flagged() -> None:
    m = model()
    txn = Transaction("t1")
    write(m, 0, b"a", b"1", txn)
    m.decided(txn, Outcome.COMMITTED)
    assert m.check("t/0", READ_UNCOMMITTED, 0, 2, [(0, b"a", b"1"), (1, b"", b"")]) == [
        "offset 1 holds no record (a marker, or nothing)"
    ]
    assert m.check("t/0", READ_UNCOMMITTED, 0, 2, [(0, b"a", b"2")]) == [
        "offset 0: read b'a'=b'2', written b'a'=b'1'"
    ]
    assert "offsets not strictly increasing: [0, 0]" in m.check(
        "t/0", READ_UNCOMMITTED, 0, 2, [(0, b"a", b"1"), (0, b"a", b"1")]
    )
