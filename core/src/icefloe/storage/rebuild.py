"""Kafka record batches from the table's Arrow columns, encoded column-wise.

A catch-up read turns Parquet rows back into the batches the producer sent. Encoding record by
record in Python costs microseconds per record; here every field of every record is encoded at
once with numpy (zigzag varints as byte matrices) and each record's bytes are concatenated by
Arrow (``binary_join_element_wise``), so Python only loops over batches, to write their
headers and CRCs. The output is byte for byte what
:func:`icefloe.storage.records.build_batch` writes for the same records, uncompressed.
"""

from __future__ import annotations

import struct
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
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TimestampType,
)
from icefloe.storage.crc import crc32c
from icefloe.storage.rebuilt import RebuiltGroup

_LOG_APPEND_TIME: Final = 0x08
_TRANSACTIONAL: Final = 0x10
_VARINT_BYTES: Final = 10
"""The longest zigzag varint of a 64-bit integer."""
_SHIFTS: Final = np.arange(0, 7 * _VARINT_BYTES, 7, dtype=np.uint64)

Int64s = npt.NDArray[np.int64]
Encoded = tuple[pa.BinaryArray, Int64s]
"""Encoded values, and the byte length of each."""


def rebuild_batches(table: pa.Table, end_offset: int | None = None) -> bytes:
    """Kafka v2 record batches (uncompressed) for the rows of ``table``, in offset order
    (:func:`rebuild_group`)."""
    return rebuild_group(table, end_offset).data


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
    rows = table.num_rows
    if rows == 0:
        return RebuiltGroup(b"", [0], [])
    bases = _int64s(table, "batch_base_offset")
    starts = np.flatnonzero(np.concatenate(([True], bases[1:] != bases[:-1])))
    counts = np.diff(np.append(starts, rows))
    offsets = _int64s(table, "offset")
    millis = _int64s(table, "timestamp") // 1000  # µs → ms
    first_millis = np.repeat(millis[starts], counts)
    records = _records(
        table,
        offset_deltas=offsets - bases,
        timestamp_deltas=millis - first_millis,
    )
    ends = np.append(starts[1:], rows)
    # Python ints for struct: per-batch values, taken out of numpy once.
    max_millis = np.maximum.reduceat(millis, starts).tolist()
    following = np.append(bases[starts[1:]], offsets[-1] + 1 if end_offset is None else end_offset)
    last_offsets = np.maximum(offsets[ends - 1], following - 1)
    last_deltas = (last_offsets - bases[starts]).tolist()
    bases_of_batches = bases[starts].tolist()
    first_millis_of_batches = millis[starts].tolist()
    batch_columns = {
        name: _int64s(table, name)[starts].tolist()
        for name in ("batch_attributes", "timestamp_type", "producer_id", "producer_epoch")
    }
    sequences = _int64s(table, "base_sequence")[starts].tolist()

    _, bounds_buffer, data_buffer = records.buffers()
    records_data = memoryview(data_buffer or b"")
    bounds = np.frombuffer(bounds_buffer, dtype=np.int32)[records.offset :]
    firsts, afters = bounds[starts], bounds[ends]
    positions = np.zeros(len(starts) + 1, dtype=np.int64)
    np.cumsum(HEADER_SIZE + afters - firsts, out=positions[1:])
    batch_bounds = zip(firsts.tolist(), afters.tolist(), strict=True)
    pieces: list[bytes | bytearray | memoryview] = []
    for b, ((first, after), count) in enumerate(zip(batch_bounds, counts.tolist(), strict=True)):
        body = records_data[first:after]
        attributes = batch_columns["batch_attributes"][b] & _TRANSACTIONAL
        if batch_columns["timestamp_type"][b] == TimestampType.LOG_APPEND_TIME:
            attributes |= _LOG_APPEND_TIME
        header = bytearray(HEADER_SIZE)
        HEADER.pack_into(
            header,
            0,
            bases_of_batches[b],
            HEADER_SIZE + len(body) - LOG_OVERHEAD,
            -1,  # partition leader epoch
            CURRENT_MAGIC,
            0,  # the CRC, below
            attributes,
            last_deltas[b],
            first_millis_of_batches[b],
            max_millis[b],
            batch_columns["producer_id"][b],
            batch_columns["producer_epoch"][b],
            sequences[b],
            count,
        )
        crc = crc32c(body, crc32c(memoryview(header)[ATTRIBUTES_AT:]))
        struct.pack_into(">I", header, CRC_AT, crc)
        pieces += (header, body)
    data = b"".join(pieces)  # the one copy of the records' bytes after Arrow's
    return RebuiltGroup(data, positions.tolist(), (last_offsets + 1).tolist())


def _records(table: pa.Table, offset_deltas: Int64s, timestamp_deltas: Int64s) -> pa.BinaryArray:
    """Every row's record bytes (length prefix included), as one binary array."""
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
    attributes = _Varints.zeros(len(body))
    before_key = [_Varints.of(body), attributes, timestamp_delta, offset_delta, key_length]
    # Each input of the join costs a pass over the rows: the fixed fields between the
    # variable ones are packed into one input each, and keys that hold no bytes (null or
    # empty, as most producers send them) are left out, their lengths packed with the value's.
    if _byte_count(keys):
        parts = [_packed(before_key)[0], keys, _packed([value_length])[0], values, headers]
    else:
        parts = [_packed([*before_key, value_length])[0], values, headers]
    return pc.binary_join_element_wise(*parts, b"", null_handling="replace", null_replacement=b"")


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
