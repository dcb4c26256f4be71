"""The fields of Kafka records, decoded field by field across many records at once.

Compaction turns every record in the WAL into a table row. Decoding record by record in Python
costs microseconds per record and makes a bytes object of every key and value, which Arrow then
copies again. Here the caller finds where each record starts and ends (its length prefix is the
only thing that says where the next one begins: :func:`icefloe.storage.records.record_bounds`),
and every field of every record is then decoded at once with numpy, one field at a time (the
inverse of :mod:`icefloe.storage.rebuild`). Keys and values become Arrow views into the
records' bytes, which Arrow copies once into their columns. Only headers are decoded record by
record, for the records that have any.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from kio.schema.errors import ErrorCode

from icefloe.storage.batch import BatchError
from icefloe.storage.records import Header, read_headers

Int64s = npt.NDArray[np.int64]

PADDING: Final = bytes(16)
"""What the records' bytes must be followed by: varints are read 10 bytes at a time and short
values 12 bytes at a time, starting as late as a record's last byte."""
_LANES: Final = np.arange(10)
_SHIFTS: Final = np.arange(0, 70, 7, dtype=np.uint64)
_INLINE: Final = 12
"""The longest value an Arrow binary view holds inline instead of pointing at it."""
_INLINE_LANES: Final = np.arange(_INLINE)
MAX_BYTES: Final = 2**31 - 1
"""The most record bytes one call decodes: views point into them with 32-bit offsets."""


@dataclass(frozen=True, slots=True)
class RecordFields:
    """Each record's fields, in record order."""

    timestamp_deltas: Int64s
    offset_deltas: Int64s
    keys: pa.BinaryArray
    values: pa.BinaryArray
    header_counts: Int64s
    headers: list[Header]
    """Every record's headers, one after another (``header_counts`` says whose)."""


def decode_fields(data: bytes, starts: Int64s, ends: Int64s) -> RecordFields:
    """The fields of the records at ``[starts[i], ends[i])`` of ``data`` (each past its length
    prefix). ``data`` ends with :data:`PADDING`, which no record covers.

    Raises:
        BatchError: a record's fields do not fit its length (``CORRUPT_MESSAGE``).
    """
    if len(data) > MAX_BYTES:
        raise ValueError(f"{len(data)} bytes of records, more than one call decodes")
    buffer = np.frombuffer(data, dtype=np.uint8)
    position = starts + 1  # the record attributes byte: unused in v2
    timestamp_deltas, position = _zigzags(buffer, position, ends)
    offset_deltas, position = _zigzags(buffer, position, ends)
    key_lengths, key_starts = _zigzags(buffer, position, ends)
    position = _skip(key_starts, key_lengths, ends, "key")
    value_lengths, value_starts = _zigzags(buffer, position, ends)
    position = _skip(value_starts, value_lengths, ends, "value")
    header_counts, position = _zigzags(buffer, position, ends)
    if (header_counts < 0).any():
        raise _corrupt("a record declares a negative header count")
    headers: list[Header] = []
    with_headers = np.flatnonzero(header_counts)
    if with_headers.size:
        try:
            for row in with_headers.tolist():
                found, position[row] = read_headers(
                    data, int(position[row]), int(header_counts[row]), int(ends[row])
                )
                headers += found
        except IndexError:
            raise _corrupt("record batch ends inside a record") from None
    if (position != ends).any():
        raise _corrupt("record length does not match its fields")
    buffer_object = pa.py_buffer(data)
    return RecordFields(
        timestamp_deltas=timestamp_deltas,
        offset_deltas=offset_deltas,
        keys=_binary(buffer, buffer_object, key_starts, key_lengths),
        values=_binary(buffer, buffer_object, value_starts, value_lengths),
        header_counts=header_counts,
        headers=headers,
    )


def _zigzags(
    buffer: npt.NDArray[np.uint8], position: Int64s, ends: Int64s
) -> tuple[Int64s, Int64s]:
    """The zigzag varint at each position, and the position after it."""
    if (position >= ends).any():
        raise _corrupt("record batch ends inside a record")
    first = buffer[position]
    raw = first.astype(np.uint64)
    width = np.ones(len(position), dtype=np.int64)
    longer = np.flatnonzero(first & 0x80)
    if longer.size:
        lanes = buffer[position[longer, None] + _LANES]
        more = lanes >= 0x80
        if more.all(axis=1).any():
            raise _corrupt("a record varint is longer than 10 bytes")
        width[longer] = np.argmin(more, axis=1) + 1
        used = width[longer, None] > _LANES
        # The 7-bit groups do not overlap, so adding them is or-ing them.
        raw[longer] = np.where(used, (lanes & 0x7F).astype(np.uint64) << _SHIFTS, 0).sum(
            axis=1, dtype=np.uint64
        )
    signed = ((raw >> np.uint64(1)) ^ (np.uint64(0) - (raw & np.uint64(1)))).view(np.int64)
    return signed, position + width


def _skip(starts: Int64s, lengths: Int64s, ends: Int64s, name: str) -> Int64s:
    """The position after each key or value (a length of -1 is null)."""
    if (lengths < -1).any():
        raise _corrupt(f"a record {name} has a negative length")
    sizes = np.maximum(lengths, 0)
    if (sizes > ends - starts).any():
        raise _corrupt(f"a record {name} does not fit in its record")
    return starts + sizes


def _binary(
    buffer: npt.NDArray[np.uint8], data: pa.Buffer, starts: Int64s, lengths: Int64s
) -> pa.BinaryArray:
    """Byte strings ``buffer[starts[i]:][:lengths[i]]`` (null where the length is -1), as Arrow
    binary views into ``data`` cast to a plain binary array: the one copy of the bytes."""
    count = len(lengths)
    valid = lengths >= 0
    views = np.zeros((count, 4), dtype=np.int32)  # 16 bytes: length, then inline or pointer
    views[:, 0] = np.where(valid, lengths, 0)
    view_bytes = views.view(np.uint8)
    inline = np.flatnonzero(valid & (lengths <= _INLINE))
    if inline.size:
        held = buffer[starts[inline, None] + _INLINE_LANES]
        held[lengths[inline, None] <= _INLINE_LANES] = 0
        view_bytes[inline, 4:16] = held
    pointed = np.flatnonzero(lengths > _INLINE)
    if pointed.size:
        view_bytes[pointed, 4:8] = buffer[starts[pointed, None] + _INLINE_LANES[:4]]
        views[pointed, 2] = 0  # the one data buffer
        views[pointed, 3] = starts[pointed]
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    array = pa.Array.from_buffers(pa.binary_view(), count, [validity, pa.py_buffer(views), data])
    return array.cast(pa.binary())


def _corrupt(message: str) -> BatchError:
    return BatchError(ErrorCode.corrupt_message, message)
