"""Which aborted transactions a fetch lists: those whose records or marker its data holds."""

from __future__ import annotations

from icefloe.storage.records import Record, build_batch
from icefloe.storage.transactions import (
    ABORT,
    COMMIT,
    AbortedTransaction,
    TransactionalBatches,
    control_batch,
)

PID = 7
T0 = 1_700_000_000_000


def records(offset: int, *, transactional: bool) -> bytes:
    return build_batch(
        [Record(offset, T0, b"k", b"v")],
        base_offset=offset,
        producer_id=PID,
        producer_epoch=0,
        base_sequence=offset,
        is_transactional=transactional,
    )


def marker(offset: int, kind: int) -> bytes:
    batch = bytearray(control_batch(PID, 0, kind))
    batch[:8] = offset.to_bytes(8, "big")  # the base offset, outside the CRC
    return bytes(batch)


ABORTED = AbortedTransaction(PID, first_offset=10, marker_offset=15)


def test_a_transaction_whose_records_and_marker_are_gone_is_not_held() -> None:
    # As read from a data file (the aborted records and the marker left out, the producer's
    # committed records plain), then the producer's next transaction in the WAL.
    data = [records(5, transactional=False), records(20, transactional=True) + marker(21, COMMIT)]
    batches = TransactionalBatches(data)
    assert batches.producers == {PID}
    assert not batches.hold(ABORTED)


def test_a_transaction_with_a_record_or_its_marker_in_the_data_is_held() -> None:
    assert TransactionalBatches([records(12, transactional=True)]).hold(ABORTED)
    assert TransactionalBatches([marker(15, ABORT), records(20, transactional=True)]).hold(ABORTED)
    # A marker at another offset is another transaction's.
    assert not TransactionalBatches([marker(9, COMMIT), records(20, transactional=True)]).hold(
        ABORTED
    )
