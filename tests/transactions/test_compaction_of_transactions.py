"""Compaction of a WAL range with transactions: markers and aborted batches stay out of the
rows, committed batches become plain ones, the range keeps every offset."""

from __future__ import annotations

import struct

import pytest

from icefloe.compaction.task import _decode_chunks
from icefloe.errors import CorruptDataError
from icefloe.ports.compaction import StreamRange
from icefloe.storage.batch import LENGTH_AT, LOG_OVERHEAD
from icefloe.storage.records import Record, build_batch
from icefloe.storage.transactions import ABORT, COMMIT, control_batch

PID = 7


def batch(offset: int, value: bytes, *, transactional: bool) -> bytes:
    return build_batch(
        [Record(offset, 1, None, value)],
        base_offset=offset,
        producer_id=PID if transactional else -1,
        producer_epoch=0 if transactional else -1,
        base_sequence=offset if transactional else -1,
        is_transactional=transactional,
    )


def test_markers_and_aborted_batches_are_left_out_and_committed_ones_become_plain() -> None:
    chunk = b"".join(
        [
            batch(0, b"plain", transactional=False),
            batch(1, b"aborted", transactional=True),
            control_batch(PID, 0, ABORT),  # offset 2
            batch(3, b"committed", transactional=True),
            control_batch(PID, 0, COMMIT),  # offset 4
        ]
    )
    pieces = [(StreamRange(1, 0, 0, 5, "wal", 0, len(chunk)), memoryview(chunk))]

    table = _decode_chunks(1, pieces, [(PID, 1, 2)])

    assert table.column("value").to_pylist() == [b"plain", b"committed"]
    assert table.column("offset").to_pylist() == [0, 3]
    assert all(a & 0x30 == 0 for a in table.column("batch_attributes").to_pylist())


@pytest.mark.timeout(30)
@pytest.mark.parametrize("change", ["no bytes", "back to the first batch", "past the chunk"])
def test_a_marker_whose_length_changed_in_storage_is_corrupt(change: str) -> None:
    """A WAL chunk is read without its object's checksum, and a marker is skipped by its
    length: one of no bytes kept compaction on it for good, one that went back made it read
    the chunk again and again, one past the chunk was taken as its end."""
    first = batch(0, b"plain", transactional=False)
    marker = bytearray(control_batch(PID, 0, COMMIT))
    sizes = {"no bytes": 0, "back to the first batch": -len(first), "past the chunk": 10_000}
    struct.pack_into(">i", marker, LENGTH_AT, sizes[change] - LOG_OVERHEAD)
    chunk = first + bytes(marker)
    pieces = [(StreamRange(1, 0, 0, 2, "wal", 0, len(chunk)), memoryview(chunk))]

    with pytest.raises(CorruptDataError, match="not whole record batches"):
        _decode_chunks(1, pieces)
