"""Kafka record batches from the table's Arrow columns, encoded column-wise.

A catch-up read turns Parquet rows back into the batches the producer sent. Encoding record by
record in Python costs microseconds per record; here every field of every record is encoded at
once with numpy (zigzag varints as byte matrices), every batch's header too (a structured
array of big-endian fields), and Arrow (``binary_join_element_wise``) writes a row group's
batches in one pass: each row's bytes are its batch's header if it is the batch's first row,
then its record. Python only loops over batches, to fill in their CRCs in place. The output is
byte for byte what :func:`icefloe.storage.records.build_batch` writes for the same records,
uncompressed.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from icefloe.storage.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    CURRENT_MAGIC,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TimestampType,
)
from icefloe.storage.crc import crc32c
from icefloe.storage.rebuilt import RebuiltGroup

_LOG_APPEND_TIME: Final = 0x08
_TRANSACTIONAL: Final = 0x10
_INT32_MAX: Final = 2**31 - 1
_VARINT_BYTES: Final = 10
"""The longest zigzag varint of a 64-bit integer."""
_SHIFTS: Final = np.arange(0, 7 * _VARINT_BYTES, 7, dtype=np.uint64)
_BATCH_HEADER: Final = np.dtype(
    [
        ("base_offset", ">i8"),
        ("batch_length", ">i4"),
        ("partition_leader_epoch", ">i4"),
        ("magic", "i1"),
        ("crc", ">u4"),
        ("attributes", ">i2"),
        ("last_offset_delta", ">i4"),
        ("base_timestamp", ">i8"),
        ("max_timestamp", ">i8"),
        ("producer_id", ">i8"),
        ("producer_epoch", ">i2"),
        ("base_sequence", ">i4"),
        ("records_count", ">i4"),
    ]
)
"""The v2 batch header as a packed numpy record (the fields of ``batch.HEADER``)."""
assert _BATCH_HEADER.itemsize == HEADER_SIZE

Int64s = npt.NDArray[np.int64]
Encoded = tuple[pa.BinaryArray, Int64s]
"""Encoded values, and the byte length of each."""


def rebuild_batches(table: pa.Table, end_offset: int | None = None) -> bytes:
    """Kafka v2 record batches (uncompressed) for the rows of ``table``, in offset order
    (:func:`rebuild_group`)."""
    return bytes(rebuild_group(table, end_offset).data)


def rebuild_group(table: pa.Table, end_offset: int | None = None) -> RebuiltGroup:
    """Kafka v2 record batches (uncompressed) for the rows of ``table``, in offset order, with
    where each one starts and the offset after it.

    Rows that share ``batch_base_offset`` make one batch, as they came from one. Where log
    compaction removed records, the offsets keep their gaps. A batch's ``lastOffsetDelta``
    reaches to the offset before the next batch's base offset (Kafka keeps a thinned batch's
    original last offset, which lies between its last record and there), and the last
    batch's reaches to ``end_offset - 1`` when given (the end of the data file), so that a
    consumer's next fetch starts past records removed from the end of a file. Without gaps
    both are the batch's own last offset.
    """
    return rebuild_groups(table, [table.num_rows], end_offset)[0]


def rebuild_groups(
    table: pa.Table, group_rows: Sequence[int], end_offset: int | None = None
) -> list[RebuiltGroup]:
    """:func:`rebuild_group` of each of the consecutive row groups ``table`` holds, of
    ``group_rows`` rows each, in one call: byte for byte the same groups (``end_offset`` is
    the last one's), for less work. A call costs over a hundred numpy and Arrow calls whatever
    its rows, as much as the rows of a 1 MiB row group cost.

    Raises:
        ValueError: ``group_rows`` does not add up to the table's rows, or the rows are not
            the records of batches in offset order (a data file changed in storage).
    """
    rows = table.num_rows
    group_starts = np.cumsum([0, *group_rows])
    if group_starts[-1] != rows:
        raise ValueError(f"row groups of {sum(group_rows)} rows in a table of {rows}")
    if rows == 0:
        return [RebuiltGroup(memoryview(b""), [0], []) for _ in group_rows]
    bases = _int64s(table, "batch_base_offset")
    # A batch starts where the base offset changes, and (as if rebuilt alone) at each group.
    is_start = np.empty(rows, dtype=bool)
    is_start[0] = True
    np.not_equal(bases[1:], bases[:-1], out=is_start[1:])
    is_start[group_starts[group_starts < rows]] = True
    starts = np.flatnonzero(is_start)
    counts = np.diff(np.append(starts, rows))
    offsets = _int64s(table, "offset")
    millis = _int64s(table, "timestamp") // 1000  # µs → ms
    records, record_sizes = _records(
        table,
        offset_deltas=offsets - bases,
        timestamp_deltas=millis - np.repeat(millis[starts], counts),
    )
    ends = np.append(starts[1:], rows)
    following = np.append(bases[starts[1:]], 0)
    ends_a_group = np.isin(ends, group_starts[1:])
    following[ends_a_group] = offsets[ends[ends_a_group] - 1] + 1
    if end_offset is not None:
        following[-1] = end_offset
    last_offsets = np.maximum(offsets[ends - 1], following - 1)
    _check_offsets(offsets, bases, starts, last_offsets)
    headers = np.zeros(len(starts), dtype=_BATCH_HEADER)
    headers["base_offset"] = bases[starts]
    headers["batch_length"] = HEADER_SIZE - LOG_OVERHEAD + np.add.reduceat(record_sizes, starts)
    headers["partition_leader_epoch"] = -1
    headers["magic"] = CURRENT_MAGIC
    headers["attributes"] = (_int64s(table, "batch_attributes")[starts] & _TRANSACTIONAL) | (
        np.where(
            _int64s(table, "timestamp_type")[starts] == TimestampType.LOG_APPEND_TIME,
            _LOG_APPEND_TIME,
            0,
        )
    )
    headers["last_offset_delta"] = last_offsets - bases[starts]
    headers["base_timestamp"] = millis[starts]
    headers["max_timestamp"] = np.maximum.reduceat(millis, starts)
    headers["producer_id"] = _int64s(table, "producer_id")[starts]
    headers["producer_epoch"] = _int64s(table, "producer_epoch")[starts]
    headers["base_sequence"] = _int64s(table, "base_sequence")[starts]
    headers["records_count"] = counts
    # Each batch's header rides on its first row: Arrow writes headers and records in one pass.
    header_bounds = np.zeros(rows + 1, dtype=np.int32)
    header_bounds[starts + 1] = HEADER_SIZE
    np.cumsum(header_bounds, out=header_bounds)
    header_column = pa.BinaryArray.from_buffers(
        pa.binary(), rows, [None, pa.py_buffer(header_bounds), pa.py_buffer(headers.view(np.uint8))]
    )
    next_offsets = (last_offsets + 1).tolist()
    first_batches = np.searchsorted(starts, group_starts).tolist()
    # Joined a group at a time, so that each group's bytes are a buffer of their own: the
    # cache counts each group's bytes and lets go of them apart.
    groups = []
    for (first_row, after_row), (first, after) in zip(
        itertools.pairwise(group_starts.tolist()), itertools.pairwise(first_batches), strict=True
    ):
        rows_of_group = after_row - first_row
        parts = [part.slice(first_row, rows_of_group) for part in (header_column, *records)]
        joined = pc.binary_join_element_wise(
            *parts, b"", null_handling="replace", null_replacement=b""
        )
        bounds = _offsets(joined)
        batch_rows = np.append(starts[first:after] - first_row, rows_of_group)
        positions = (bounds[batch_rows].astype(np.int64) - bounds[0]).tolist()
        data = _writable(joined.buffers()[2])[bounds[0] : bounds[-1]]
        for start, end in itertools.pairwise(positions):
            struct.pack_into(">I", data, start + CRC_AT, crc32c(data[start + ATTRIBUTES_AT : end]))
        groups.append(RebuiltGroup(data, positions, next_offsets[first:after]))
    return groups


def _check_offsets(offsets: Int64s, bases: Int64s, starts: Int64s, last_offsets: Int64s) -> None:
    """Rows that could not have come from batches are refused, not rebuilt into batches that
    a consumer refuses or that move it backwards: offsets rise row by row, and each batch's
    lie within ``[base offset, base offset + 2^31)``, after the previous batch's.

    Raises:
        ValueError: what does not hold.
    """
    if (offsets[1:] <= offsets[:-1]).any():
        raise ValueError("the rows' offsets do not rise row by row")
    following = np.flatnonzero(bases[1:] != bases[:-1]) + 1  # a batch's first row
    if (offsets < bases).any() or (bases[following] <= offsets[following - 1]).any():
        raise ValueError("a row's offset lies before its batch's base offset")
    if (last_offsets - bases[starts] > _INT32_MAX).any():
        raise ValueError("a batch's offsets reach past 2^31 from its base offset")


def _writable(buffer: pa.Buffer | None) -> memoryview:
    """A writable view of a buffer Arrow just made (a copy, should Arrow make it read-only)."""
    view = memoryview(buffer if buffer is not None else b"")
    return memoryview(bytearray(view)) if view.readonly else view


def _records(
    table: pa.Table, offset_deltas: Int64s, timestamp_deltas: Int64s
) -> tuple[list[pa.BinaryArray], Int64s]:
    """The binary arrays that, joined row by row, give every row's record bytes (length prefix
    included), and each row's record size."""
    keys = _binary(table, "key")
    values = _binary(table, "value")
    key_lengths = _lengths(keys)
    value_lengths = _lengths(values)
    headers, header_lengths = _headers(table.column("headers"))
    timestamp_delta = _Varints.of(timestamp_deltas)
    offset_delta = _Varints.of(offset_deltas)
    key_length = _Varints.of(key_lengths)
    value_length = _Varints.of(value_lengths)
    # The length prefix counts what follows it; summed here, so the bytes are joined once.
    body = 1 + header_lengths  # the record attributes byte (unused in v2: zero), the headers
    for varints in (timestamp_delta, offset_delta, key_length, value_length):
        body += varints.sizes
    body += key_lengths.clip(min=0) + value_lengths.clip(min=0)
    length = _Varints.of(body)
    attributes = _Varints.zeros(len(body))
    before_key = [length, attributes, timestamp_delta, offset_delta, key_length]
    # Each input of the join costs a pass over the rows: the fixed fields between the
    # variable ones are packed into one input each, and keys that hold no bytes (null or
    # empty, as most producers send them) are left out, their lengths packed with the value's.
    if _byte_count(keys):
        parts = [_packed(before_key)[0], keys, _packed([value_length])[0], values, headers]
    else:
        parts = [_packed([*before_key, value_length])[0], values, headers]
    return parts, length.sizes + body


def _headers(column: pa.ChunkedArray) -> Encoded:
    """Each row's header count and headers, encoded, and their byte lengths."""
    lists = _single_chunk(column)
    counts = np.diff(_offsets(lists)).astype(np.int64)
    if not counts.any():
        return _packed([_Varints.zeros(len(counts))])
    flat = lists.values  # indexed by the list offsets, even when the column is a slice
    keys = flat.field("key").cast(pa.binary())
    values = flat.field("value")
    encoded = pc.binary_join_element_wise(
        _packed([_Varints.of(_lengths(keys))])[0],
        keys,
        _packed([_Varints.of(_lengths(values))])[0],
        values,
        b"",
        null_handling="replace",
        null_replacement=b"",
    )
    per_row = pa.ListArray.from_arrays(lists.offsets, encoded)
    count_prefixes, _ = _packed([_Varints.of(counts)])
    joined = pc.binary_join_element_wise(count_prefixes, pc.binary_join(per_row, b""), b"")
    return joined, _lengths(joined)


def _binary(table: pa.Table, name: str) -> pa.BinaryArray:
    return _single_chunk(table.column(name))


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when it already is one (a row group is)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _int64s(table: pa.Table, name: str) -> Int64s:
    """An integer (or timestamp) column's values as int64, without a copy where they are."""
    column = _single_chunk(table.column(name))
    if pa.types.is_timestamp(column.type):
        column = column.view(pa.int64())
    return np.asarray(column.to_numpy(), dtype=np.int64)


def _offsets(array: pa.Array) -> npt.NDArray[np.int32]:
    """The value offsets of a binary or list array (of its slice, if it is one)."""
    buffer = array.buffers()[1]
    return np.frombuffer(buffer, dtype=np.int32)[array.offset : array.offset + len(array) + 1]


def _lengths(array: pa.Array) -> Int64s:
    """Byte lengths, with -1 for nulls (Kafka's null key or value), read off the offsets."""
    lengths = np.diff(_offsets(array)).astype(np.int64)
    if array.null_count == len(array):
        lengths[:] = -1
    elif array.null_count:
        lengths[array.is_null().to_numpy(zero_copy_only=False)] = -1
    return lengths


def _byte_count(array: pa.Array) -> int:
    """The bytes a binary array's values hold together."""
    offsets = _offsets(array)
    return int(offsets[-1] - offsets[0])


@dataclass(frozen=True, slots=True)
class _Varints:
    """One field of every row as Kafka zigzag varints, before they are packed into bytes."""

    zigzag: npt.NDArray[np.uint64]
    sizes: Int64s
    """Each varint's byte length: one byte per started 7 bits, and at least one."""
    width: int
    """The longest varint's byte length."""

    @classmethod
    def of(cls, values: Int64s) -> _Varints:
        zigzag = ((values << 1) ^ (values >> 63)).astype(np.uint64)
        top = int(zigzag.max()) if len(zigzag) else 0
        width = max(1, (top.bit_length() + 6) // 7)
        sizes = np.ones(len(values), dtype=np.int64)
        for shift in _SHIFTS[1:width]:
            sizes += zigzag >= (np.uint64(1) << shift)
        return cls(zigzag, sizes, width)

    @classmethod
    def zeros(cls, count: int) -> _Varints:
        return cls(np.zeros(count, dtype=np.uint64), np.ones(count, dtype=np.int64), 1)


def _packed(fields: list[_Varints]) -> Encoded:
    """Each row's ``fields`` back to back, as one binary array, and each row's byte length.

    The bytes go into a matrix of byte numbers by rows (so that numpy works along the rows),
    each field taking as many byte numbers as its longest varint, with a mask of the bytes
    each row's varints take; they are read out row by row through the mask.
    """
    count = len(fields[0].sizes)
    width = sum(field.width for field in fields)
    data = np.empty((width, count), dtype=np.uint8)
    taken = np.ones((width, count), dtype=bool)
    at = 0  # the field's first byte number
    for field in fields:
        if field.width == 1:
            data[at] = field.zigzag
        else:
            shifts = _SHIFTS[: field.width, None]
            byte_numbers = np.arange(field.width)[:, None]
            more = (byte_numbers < field.sizes - 1).astype(np.uint64)  # the continuation bit
            groups = (field.zigzag >> shifts) & np.uint64(0x7F)
            data[at : at + field.width] = groups | (more << np.uint64(7))
            taken[at : at + field.width] = byte_numbers < field.sizes
        at += field.width
    sizes = fields[0].sizes.copy()
    for field in fields[1:]:
        sizes += field.sizes
    bounds = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(sizes, out=bounds[1:])
    packed = data.T[taken.T]
    array = pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(bounds), pa.py_buffer(packed)]
    )
    return array, sizes
