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
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from icefloe.storage.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    CURRENT_MAGIC,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    TimestampType,
)

_LOG_APPEND_TIME: Final = 0x08
_TRANSACTIONAL: Final = 0x10
_VARINT_BYTES: Final = 10
"""The longest zigzag varint of a 64-bit integer."""
_SHIFTS: Final = np.arange(0, 7 * _VARINT_BYTES, 7, dtype=np.uint64)

Int64s = npt.NDArray[np.int64]
Encoded = tuple[pa.BinaryArray, Int64s]
"""Encoded values, and the byte length of each."""


def rebuild_batches(table: pa.Table, end_offset: int | None = None) -> bytes:
    """Kafka v2 record batches (uncompressed) for the rows of ``table``, in offset order.

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
        return b""
    bases = _int64s(table, "batch_base_offset")
    starts = np.flatnonzero(np.concatenate(([True], bases[1:] != bases[:-1])))
    counts = np.diff(np.append(starts, rows))
    offsets = _int64s(table, "offset")
    millis = table.column("timestamp").cast(pa.int64()).to_numpy() // 1000
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
    data = memoryview(data_buffer or b"")
    bounds = np.frombuffer(bounds_buffer, dtype=np.int32)[records.offset :][: rows + 1].tolist()
    pieces: list[bytes | bytearray | memoryview] = []
    for b, (start, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        body = data[bounds[start] : bounds[end]]
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
            end - start,
        )
        crc = crc32c(body, crc32c(memoryview(header)[ATTRIBUTES_AT:]))
        struct.pack_into(">I", header, CRC_AT, crc)
        pieces += (header, body)
    return b"".join(pieces)  # the one copy of the records' bytes after Arrow's


def _records(table: pa.Table, offset_deltas: Int64s, timestamp_deltas: Int64s) -> pa.BinaryArray:
    """Every row's record bytes (length prefix included), as one binary array."""
    keys = _binary(table, "key")
    values = _binary(table, "value")
    key_lengths = _lengths(keys)
    value_lengths = _lengths(values)
    fields = [
        _varints(timestamp_deltas),
        _varints(offset_deltas),
        _varints(key_lengths),
        (keys, key_lengths),
        _varints(value_lengths),
        (values, value_lengths),
        _headers(table.column("headers")),
    ]
    # The length prefix counts what follows it; summed here, so the bytes are joined once.
    lengths = np.ones(len(offset_deltas), dtype=np.int64)  # the record attributes byte
    for _, field_lengths in fields:
        lengths += field_lengths.clip(min=0)
    prefix, _ = _varints(lengths)
    return pc.binary_join_element_wise(
        prefix,
        _zero_bytes(len(offset_deltas)),  # record attributes: unused in v2
        *(array for array, _ in fields),
        b"",
        null_handling="replace",
        null_replacement=b"",
    )


def _headers(column: pa.ChunkedArray) -> Encoded:
    """Each row's header count and headers, encoded, and their byte lengths."""
    lists = _single_chunk(column)
    counts = np.diff(_offsets(lists)).astype(np.int64)
    if not counts.any():
        return _varints(counts)
    flat = lists.values  # indexed by the list offsets, even when the column is a slice
    keys = flat.field("key").cast(pa.binary())
    values = flat.field("value")
    key_prefixes, _ = _varints(_lengths(keys))
    value_prefixes, _ = _varints(_lengths(values))
    encoded = pc.binary_join_element_wise(
        key_prefixes,
        keys,
        value_prefixes,
        values,
        b"",
        null_handling="replace",
        null_replacement=b"",
    )
    per_row = pa.ListArray.from_arrays(lists.offsets, encoded)
    count_prefixes, _ = _varints(counts)
    joined = pc.binary_join_element_wise(count_prefixes, pc.binary_join(per_row, b""), b"")
    return joined, _lengths(joined)


def _zero_bytes(count: int) -> pa.BinaryArray:
    bounds = np.arange(count + 1, dtype=np.int32)
    return pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(bounds), pa.py_buffer(bytes(count))]
    )


def _binary(table: pa.Table, name: str) -> pa.BinaryArray:
    return _single_chunk(table.column(name))


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array, without a copy when it already is one (a row group is)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _int64s(table: pa.Table, name: str) -> Int64s:
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def _offsets(array: pa.Array) -> npt.NDArray[np.int32]:
    """The value offsets of a binary or list array (of its slice, if it is one)."""
    buffer = array.buffers()[1]
    return np.frombuffer(buffer, dtype=np.int32)[array.offset : array.offset + len(array) + 1]


def _lengths(array: pa.Array) -> Int64s:
    """Byte lengths, with -1 for nulls (Kafka's null key or value), read off the offsets."""
    lengths = np.diff(_offsets(array)).astype(np.int64)
    if array.null_count:
        lengths[array.is_null().to_numpy(zero_copy_only=False)] = -1
    return lengths


def _varints(values: Int64s) -> Encoded:
    """Each value as a Kafka zigzag varint, and each varint's byte length."""
    zigzag = ((values << 1) ^ (values >> 63)).astype(np.uint64)
    count = len(values)
    if count == 0 or int(zigzag.max()) < 0x80:  # one byte each: offset deltas, most lengths
        sizes = np.ones(count, dtype=np.int64)
        data = zigzag.astype(np.uint8)
    else:
        # A value takes one byte per started 7 bits, and at least one.
        width = (int(zigzag.max()).bit_length() + 6) // 7
        sizes = np.ones(count, dtype=np.int64)
        for shift in _SHIFTS[1:width]:
            sizes += zigzag >= (np.uint64(1) << shift)
        columns = np.arange(width)
        groups = (zigzag[:, None] >> _SHIFTS[:width]) & np.uint64(0x7F)
        more = columns < (sizes - 1)[:, None]
        encoded = (groups | (more.astype(np.uint64) << np.uint64(7))).astype(np.uint8)
        data = encoded[columns < sizes[:, None]]
    bounds = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(sizes, out=bounds[1:])
    array = pa.BinaryArray.from_buffers(
        pa.binary(), count, [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )
    return array, sizes
