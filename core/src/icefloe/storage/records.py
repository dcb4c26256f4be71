"""Records inside v2 record batches: build a batch from records, decode a batch into records.

This is the slow path, used where records must be seen one by one: the library's "append
records" API, compaction to Parquet, and rebuilding batches from Parquet for fetch. The
produce and fetch paths never come here (see :mod:`icefloe.storage.batch`).

A record inside a batch, after the batch header and after decompression::

    length          varint   bytes of the record after this field
    attributes      int8     unused, 0
    timestampDelta  varlong  timestamp minus the batch's baseTimestamp
    offsetDelta     varint   offset minus the batch's baseOffset
    keyLength       varint   -1 for a null key
    key             bytes
    valueLength     varint   -1 for a null value
    value           bytes
    headerCount     varint
    headers         keyLength varint, key (UTF-8), valueLength varint (-1: null), value

Varints are zigzag-encoded base-128 (protobuf style). Compression covers all records as one
block: gzip; snappy in the xerial framing that Java clients write and read (raw snappy, which
librdkafka writes, is accepted when reading); the LZ4 frame format with independent blocks
(Java's reader refuses linked blocks); zstd.

Why the record loop looks hand-unrolled: decoding is compaction's CPU cost. Measured on one
core with 1 KiB values, ``kio.records.read_batch`` managed about 140k records/s (and truncates
timestamps to seconds), a loop calling a varint helper per field about 550k/s, and the loop
below, which inlines the one-byte case of every varint and builds each :class:`Record` with
``tuple.__new__``, about 0.9M/s. ``tests/bench/test_bench_records.py`` keeps measuring it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple

import cramjam
from kio.schema.errors import ErrorCode

from icefloe.storage.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    CURRENT_MAGIC,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    BatchError,
    BatchHeader,
    Compression,
    TimestampType,
)
from icefloe.storage.crc import crc32c

Header = tuple[str, bytes | None]
"""A record header: Kafka headers are an ordered list, and a key may repeat."""

_NO_HEADERS: Final[tuple[Header, ...]] = ()
_INT32_MAX: Final = 2**31 - 1
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
"""Magic, then version 1 and minimum compatible version 1, as snappy-java writes them."""
_XERIAL_BLOCK: Final = 32 * 1024
"""Uncompressed bytes per xerial block: snappy-java's default."""
_BLOCK_LENGTH: Final = struct.Struct(">i")

DEFAULT_MAX_UNCOMPRESSED_BYTES: Final = 64 * 1024 * 1024
"""Largest decompressed record data :func:`decode_batch` accepts unless told otherwise."""


class Record(NamedTuple):
    """One Kafka record, with its absolute offset and full-precision timestamp.

    Header keys are UTF-8 on the wire. Kafka does not check that, so bytes that are not
    UTF-8 decode to lone surrogates (``surrogateescape``) and encode back to the same bytes.
    """

    offset: int
    timestamp: int
    """Milliseconds since the epoch (for log-append-time batches: the batch's append time)."""
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = _NO_HEADERS


# --- encoding --------------------------------------------------------------------------------


def recompress(batch: bytes | bytearray | memoryview, compression: Compression) -> bytes:
    """One validated producer batch with its records compressed by ``compression`` instead,
    as Kafka's broker rewrites the batches of a topic whose ``compression.type`` differs from
    the producer's: same records, timestamps and headers, same producer id, epoch and sequence.

    Raises:
        BatchError: the records do not decode or decompress past the limit
            (``CORRUPT_MESSAGE``); their offsets do not run on one by one from the batch's
            first (``INVALID_RECORD``: Kafka refuses such a batch whenever it decodes one);
            their timestamps lie further apart than a timestamp delta reaches
            (``INVALID_TIMESTAMP``).
    """
    header, records = decode_batch(batch)
    first_timestamp = records[0].timestamp if records else 0
    for i, record in enumerate(records):
        if record.offset != header.base_offset + i:
            raise BatchError(
                ErrorCode.invalid_record,
                f"record {i} of the batch has offset delta {record.offset - header.base_offset}"
                f", not {i}: a batch's records must have consecutive offsets",
            )
        if not _INT64_MIN <= record.timestamp - first_timestamp <= _INT64_MAX:
            raise BatchError(
                ErrorCode.invalid_timestamp,
                f"record {i} of the batch has timestamp {record.timestamp}, too far from the "
                f"first record's {first_timestamp}",
            )
    return build_batch(
        records,
        compression=compression,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
    )


def build_batch(
    records: Sequence[Record],
    *,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
) -> bytes:
    """Encode records as one valid v2 record batch.

    Each record's offset delta is ``record.offset - base_offset``; offsets must increase
    strictly from ``base_offset`` on (gaps are allowed, as in a compacted Kafka log, but a
    producer's batch has none). The base timestamp is the first record's, like Kafka clients
    write it.

    Args:
        records: at least one record, in offset order.
        compression: the codec for the records block.
        base_offset: 0 for a batch to produce; the real offset when rebuilding a stored one.
        producer_id: -1 unless the batch is idempotent.
        producer_epoch: -1 unless the batch is idempotent.
        base_sequence: -1 unless the batch is idempotent.
        timestamp_type: log-append-time batches are read back with ``maxTimestamp`` as every
            record's timestamp (Kafka's rule), so pass the append time as the records'.
        is_transactional: sets the transactional attribute bit.
        is_control: sets the control attribute bit (a transaction marker).
        partition_leader_epoch: written as is; it lies outside the CRC.

    Returns:
        The batch bytes.

    Raises:
        ValueError: no records, offsets not increasing, or a field out of Kafka's range.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    first_timestamp = records[0].timestamp
    max_timestamp = first_timestamp
    body = bytearray()
    previous_delta = -1
    for record in records:
        offset_delta = record.offset - base_offset
        if not previous_delta < offset_delta <= _INT32_MAX:
            raise ValueError(
                f"record offset {record.offset} does not follow the previous one within "
                f"base offset {base_offset} + 2^31"
            )
        previous_delta = offset_delta
        timestamp = record.timestamp
        if not _INT64_MIN <= timestamp - first_timestamp <= _INT64_MAX:
            raise ValueError(
                f"timestamp {timestamp} is too far from the first record's {first_timestamp}"
            )
        if timestamp > max_timestamp:
            max_timestamp = timestamp
        _append_record(body, offset_delta, timestamp - first_timestamp, record)
    if compression is not Compression.NONE:
        body = bytearray(_compress(compression, body))
    attributes = int(compression)
    if timestamp_type is TimestampType.LOG_APPEND_TIME:
        attributes |= 0x08
    if is_transactional:
        attributes |= 0x10
    if is_control:
        attributes |= 0x20
    batch = bytearray(HEADER_SIZE)
    batch += body
    try:
        HEADER.pack_into(
            batch,
            0,
            base_offset,
            len(batch) - LOG_OVERHEAD,
            partition_leader_epoch,
            CURRENT_MAGIC,
            0,  # the CRC, written below once the bytes it covers are final
            attributes,
            previous_delta,
            first_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
    except struct.error as exc:
        raise ValueError(f"a batch header field is out of range: {exc}") from None
    struct.pack_into(">I", batch, CRC_AT, crc32c(memoryview(batch)[ATTRIBUTES_AT:]))
    return bytes(batch)


def empty_batch(base_offset: int, end_offset: int) -> bytes:
    """A v2 record batch of no records over the offsets ``[base_offset, end_offset)``: what
    Kafka's log cleaner leaves of a batch it removed every record of (when it keeps the
    batch). A consumer's position moves past its last offset, as past any batch's.

    Raises:
        ValueError: the range is empty or wider than a batch's offset delta reaches.
    """
    last_delta = end_offset - 1 - base_offset
    if not 0 <= last_delta <= _INT32_MAX:
        raise ValueError(f"no batch covers the offsets [{base_offset}, {end_offset})")
    batch = bytearray(HEADER_SIZE)
    HEADER.pack_into(
        batch,
        0,
        base_offset,
        HEADER_SIZE - LOG_OVERHEAD,
        -1,  # partition leader epoch
        CURRENT_MAGIC,
        0,  # the CRC, written below
        0,  # attributes: no compression, create time, neither transactional nor control
        last_delta,
        -1,  # no timestamps: there is no record
        -1,
        -1,  # no producer
        -1,
        -1,
        0,
    )
    struct.pack_into(">I", batch, CRC_AT, crc32c(memoryview(batch)[ATTRIBUTES_AT:]))
    return bytes(batch)


def _append_record(out: bytearray, offset_delta: int, timestamp_delta: int, record: Record) -> None:
    body = bytearray(b"\x00")  # attributes: unused by v2 records
    _put_varint(body, timestamp_delta)
    _put_varint(body, offset_delta)
    _put_bytes(body, record.key)
    _put_bytes(body, record.value)
    _put_varint(body, len(record.headers))
    for header_key, header_value in record.headers:
        _put_bytes(body, header_key.encode("utf-8", "surrogateescape"))
        _put_bytes(body, header_value)
    _put_varint(out, len(body))
    out += body


def _put_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out.append(1)  # zigzag(-1)
    else:
        _put_varint(out, len(data))
        out += data


def _put_varint(out: bytearray, value: int) -> None:
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _compress(compression: Compression, data: bytearray) -> bytes:
    if compression is Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if compression is Compression.SNAPPY:
        return _xerial_compress(data)
    if compression is Compression.LZ4:
        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(bytes(data))
        return bytes(compressor.finish())
    if compression is Compression.ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression {compression!r}")


def _xerial_compress(data: bytearray) -> bytes:
    view = memoryview(data)
    parts = [_XERIAL_HEADER]
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        parts.append(_BLOCK_LENGTH.pack(len(block)))
        parts.append(block)
    return b"".join(parts)


# --- decoding --------------------------------------------------------------------------------


def decode_batch(
    batch: bytes | bytearray | memoryview,
    *,
    base_offset: int | None = None,
    verify_crc: bool = True,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> tuple[BatchHeader, list[Record]]:
    """Decode one whole v2 record batch, decompressing its records if needed.

    Args:
        batch: exactly one batch.
        base_offset: the batch's real base offset, for bytes read from a WAL chunk before
            patching; the header's own value is used when ``None``.
        verify_crc: check the batch's CRC-32C first.
        max_uncompressed_bytes: refuse compressed batches whose records expand beyond this.
            Snappy declares its sizes, so it is refused before expanding; gzip, lz4 and
            zstd are checked after (lz4 expands at most ~255x, gzip ~1000x; a zstd bomb can
            expand further, and the compaction engine should bound memory around it).

    Returns:
        The header and the records in order. Control batches decode too; their records carry
        the control key and value as bytes.

    Raises:
        BatchError: the bytes are not one valid batch (``CORRUPT_MESSAGE``), or use a codec
            Kafka does not define (``UNSUPPORTED_COMPRESSION_TYPE``).
    """
    header, records_data, start = batch_records(
        batch, verify_crc=verify_crc, max_uncompressed_bytes=max_uncompressed_bytes
    )
    first_offset = header.base_offset if base_offset is None else base_offset
    log_append_time = header.attributes & 0x08
    try:
        records = _decode_records(
            records_data,
            start,
            header.record_count,
            first_offset,
            header.base_timestamp,
            header.max_timestamp if log_append_time else None,
        )
    except IndexError:
        raise _corrupt("record batch ends inside a record") from None
    return header, records


def batch_records(
    batch: bytes | bytearray | memoryview,
    *,
    verify_crc: bool = True,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> tuple[BatchHeader, bytes, int]:
    """One v2 batch's header, checked, and its records' bytes, decompressed if need be, with
    the position of the first record in them (arguments and errors as :func:`decode_batch`)."""
    data = bytes(batch)
    if len(data) < HEADER_SIZE:
        raise _corrupt(f"record batch is truncated: {len(data)} bytes, a header needs 61")
    header = BatchHeader._make(HEADER.unpack_from(data))
    if header.magic != CURRENT_MAGIC:
        raise _corrupt(f"record batch has magic {header.magic}, not 2")
    if header.size != len(data):
        raise _corrupt(
            f"record batch declares {header.size} bytes but {len(data)} were given",
        )
    if verify_crc and crc32c(memoryview(data)[ATTRIBUTES_AT:]) != header.crc:
        raise _corrupt("record batch fails its CRC-32C check")
    codec = header.attributes & 0x07
    if codec > Compression.ZSTD:
        raise BatchError(
            ErrorCode.unsupported_compression_type,
            f"record batch uses unknown compression codec id {codec}",
        )
    if codec == Compression.NONE:
        return header, data, HEADER_SIZE
    return (
        header,
        _decompress(Compression(codec), memoryview(data)[HEADER_SIZE:], max_uncompressed_bytes),
        0,
    )


def _decode_records(
    data: bytes,
    position: int,
    count: int,
    base_offset: int,
    base_timestamp: int,
    log_append_time: int | None,
) -> list[Record]:
    """The record loop: hot, so it inlines the one-byte varint case and skips ``__init__``.

    A slice past the end of ``data`` silently comes back short; the length check at the end
    of each record catches that, and :exc:`IndexError` from a byte index past the end is
    turned into a :class:`BatchError` by the caller.
    """
    if count < 0:
        raise _corrupt(f"record batch declares {count} records")
    end = len(data)
    new_record = tuple.__new__
    record_type = Record
    slow_varint = _read_varint
    records: list[Record] = []
    append = records.append
    for _ in range(count):
        # Zigzag: raw value v stands for (v >> 1) ^ -(v & 1); one byte holds -64..63.
        raw = data[position]
        if raw < 0x80:
            position += 1
        else:
            raw, position = slow_varint(data, position)
        length = (raw >> 1) ^ -(raw & 1)
        record_end = position + length
        if length <= 0 or record_end > end:
            raise _corrupt(f"record length {length} does not fit in the batch")
        position += 1  # attributes
        raw = data[position]
        if raw < 0x80:
            position += 1
        else:
            raw, position = slow_varint(data, position)
        timestamp = base_timestamp + ((raw >> 1) ^ -(raw & 1))
        raw = data[position]
        if raw < 0x80:
            position += 1
        else:
            raw, position = slow_varint(data, position)
        offset = base_offset + ((raw >> 1) ^ -(raw & 1))

        raw = data[position]
        if raw < 0x80:
            position += 1
        else:
            raw, position = slow_varint(data, position)
        size = (raw >> 1) ^ -(raw & 1)
        if size >= 0:
            key: bytes | None = data[position : position + size]
            position += size
        elif size == -1:
            key = None
        else:
            raise _corrupt(f"record key length {size}")

        raw = data[position]
        if raw < 0x80:
            position += 1
        else:
            raw, position = slow_varint(data, position)
        size = (raw >> 1) ^ -(raw & 1)
        if size >= 0:
            value: bytes | None = data[position : position + size]
            position += size
        elif size == -1:
            value = None
        else:
            raise _corrupt(f"record value length {size}")

        raw = data[position]
        if raw < 0x80:
            position += 1
        else:
            raw, position = slow_varint(data, position)
        header_count = (raw >> 1) ^ -(raw & 1)
        if header_count == 0:
            headers = _NO_HEADERS
        else:
            headers, position = read_headers(data, position, header_count, record_end)

        if position != record_end:
            raise _corrupt("record length does not match its fields")
        if log_append_time is not None:
            timestamp = log_append_time
        append(new_record(record_type, (offset, timestamp, key, value, headers)))
    if position != end:
        raise _corrupt(f"{end - position} bytes follow the batch's last record")
    return records


def record_bounds(data: bytes, position: int, count: int) -> list[int]:
    """Where each of ``count`` records from ``position`` starts (past its length prefix) and
    ends, flat: ``[start, end, start, end, ...]``. Only the length prefixes are read: the
    fields are left to the caller (:mod:`icefloe.storage.record_columns`).

    Raises:
        BatchError: a length does not fit in ``data``, or bytes follow the last record.
    """
    if count < 0:
        raise _corrupt(f"record batch declares {count} records")
    end = len(data)
    bounds: list[int] = []
    append = bounds.append
    slow_varint = _read_varint
    try:
        for _ in range(count):
            raw = data[position]
            if raw < 0x80:
                position += 1
            elif data[position + 1] < 0x80:  # records of 64 bytes to 8 KiB
                raw = (raw & 0x7F) | data[position + 1] << 7
                position += 2
            else:
                raw, position = slow_varint(data, position)
            length = (raw >> 1) ^ -(raw & 1)
            record_end = position + length
            if length <= 0 or record_end > end:
                raise _corrupt(f"record length {length} does not fit in the batch")
            append(position)
            append(record_end)
            position = record_end
    except IndexError:
        raise _corrupt("record batch ends inside a record") from None
    if position != end:
        raise _corrupt(f"{end - position} bytes follow the batch's last record")
    return bounds


def read_headers(
    data: bytes, position: int, count: int, record_end: int
) -> tuple[tuple[Header, ...], int]:
    """``count`` record headers from ``position``, which must end by ``record_end``, and the
    position after them."""
    # Each header takes at least two bytes, so a larger count cannot be honest (and would
    # otherwise make the loop below run for a very long time).
    if count < 0 or 2 * count > record_end - position:
        raise _corrupt(f"record declares {count} headers")
    headers: list[Header] = []
    for _ in range(count):
        size, position = _read_zigzag(data, position)
        if size < 0:
            raise _corrupt(f"record header key length {size}")
        key = data[position : position + size].decode("utf-8", "surrogateescape")
        position += size
        size, position = _read_zigzag(data, position)
        if size >= 0:
            value: bytes | None = data[position : position + size]
            position += size
        elif size == -1:
            value = None
        else:
            raise _corrupt(f"record header value length {size}")
        headers.append((key, value))
    return tuple(headers), position


def _read_zigzag(data: bytes, position: int) -> tuple[int, int]:
    raw, position = _read_varint(data, position)
    return (raw >> 1) ^ -(raw & 1), position


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """An unsigned base-128 varint of at most 10 bytes (a varlong), and the next position."""
    result = 0
    shift = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, position
        shift += 7
        if shift >= 70:
            raise _corrupt("varint longer than 10 bytes")


def _decompress(compression: Compression, data: memoryview, limit: int) -> bytes:
    try:
        if compression is Compression.SNAPPY:
            out = _snappy_decompress(data, limit)
        elif compression is Compression.GZIP:
            out = bytes(cramjam.gzip.decompress(data))
        elif compression is Compression.LZ4:
            out = bytes(cramjam.lz4.decompress(data))
        else:
            out = bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise _corrupt(f"{compression.name.lower()} records do not decompress: {exc}") from None
    if len(out) > limit:
        raise _too_large(compression, limit)
    return out


def _snappy_decompress(data: memoryview, limit: int) -> bytes:
    """Xerial-framed snappy (Java clients) or raw snappy (librdkafka), told apart by magic.

    The uncompressed size of every raw block is read before it is expanded, so a batch that
    claims more than ``limit`` bytes is refused without allocating them.
    """
    if len(data) < len(_XERIAL_HEADER) or bytes(data[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
        if cramjam.snappy.decompress_raw_len(data) > limit:
            raise _too_large(Compression.SNAPPY, limit)
        return bytes(cramjam.snappy.decompress_raw(data))
    # The version fields after the magic are not checked: some writers get them wrong, and
    # no other framing version exists.
    parts: list[bytes] = []
    total = 0
    position = len(_XERIAL_HEADER)
    while position < len(data):
        if len(data) - position < 4:
            raise _corrupt("xerial snappy block length is truncated")
        (size,) = _BLOCK_LENGTH.unpack_from(data, position)
        position += 4
        if size < 0 or size > len(data) - position:
            raise _corrupt(f"xerial snappy block of {size} bytes does not fit")
        block = data[position : position + size]
        position += size
        total += cramjam.snappy.decompress_raw_len(block)
        if total > limit:
            raise _too_large(Compression.SNAPPY, limit)
        parts.append(bytes(cramjam.snappy.decompress_raw(block)))
    return b"".join(parts)


def _corrupt(message: str) -> BatchError:
    return BatchError(ErrorCode.corrupt_message, message)


def _too_large(compression: Compression, limit: int) -> BatchError:
    return BatchError(
        ErrorCode.corrupt_message,
        f"{compression.name.lower()} records expand beyond {limit} bytes",
    )
