"""Kafka v2 record batch headers: validation on produce, base-offset patching on fetch.

A v2 record batch starts with a fixed 61-byte header, all fields big-endian::

    offset  size  field
         0     8  baseOffset            outside the CRC: the broker (here: the reader) sets it
         8     4  batchLength           bytes after this field, so the batch is 12 + batchLength
        12     4  partitionLeaderEpoch  outside the CRC: set by the broker
        16     1  magic                 2
        17     4  crc                   CRC-32C of bytes 21 .. end
        21     2  attributes            codec (bits 0-2), timestamp type (3), transactional (4),
                                        control (5)
        23     4  lastOffsetDelta
        27     8  baseTimestamp         the first record's timestamp
        35     8  maxTimestamp
        43     8  producerId
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordCount
        61        records (compressed as a whole when the codec is not "none")

Everything here works on headers only: the produce path never decodes records and never
decompresses (that is :mod:`icefloe.storage.records`), so it costs one CRC pass per batch.
Because baseOffset and partitionLeaderEpoch lie outside the CRC, stored batches keep a
placeholder base offset and the reader writes the real one without touching the CRC.
"""

from __future__ import annotations

import enum
import struct
from typing import Final, NamedTuple

from kio.schema.errors import ErrorCode

from icefloe.errors import CorruptDataError, KafkaError
from icefloe.storage.crc import crc32c

HEADER: Final = struct.Struct(">qiibIhiqqqhii")
"""The 61-byte v2 batch header, field by field (see the module docstring)."""

HEADER_SIZE: Final = HEADER.size
LOG_OVERHEAD: Final = 12
"""baseOffset and batchLength: the bytes that ``batchLength`` does not count."""
MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD
"""The smallest valid ``batchLength``: a header with no records."""

BASE_OFFSET_AT: Final = 0
LENGTH_AT: Final = 8
PARTITION_LEADER_EPOCH_AT: Final = 12
MAGIC_AT: Final = 16
CRC_AT: Final = 17
ATTRIBUTES_AT: Final = 21
MAX_TIMESTAMP_AT: Final = 35
_LOG_APPEND_TIME_BIT: Final = 0x08
LAST_OFFSET_DELTA_AT: Final = 23
CURRENT_MAGIC: Final = 2

_CODEC_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20

_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_LENGTH_AND_EPOCH: Final = struct.Struct(">iib")
"""batchLength, partitionLeaderEpoch and magic: what a reader needs to walk a chunk."""
_CRC_AND_DELTA: Final = struct.Struct(">Ihi")
"""crc, attributes and lastOffsetDelta, read together by the fetch path."""


class Compression(enum.IntEnum):
    """The codec in attributes bits 0-2; Kafka defines no others."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(enum.IntEnum):
    """Attributes bit 3: who set the record timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchError(KafkaError, CorruptDataError):
    """A record batch was rejected; ``error_code`` is the Kafka error for the produce response.

    Also a :class:`CorruptDataError`, so code that only cares "these bytes are bad" catches
    both stored and received corruption with one ``except``.
    """


class BatchHeader(NamedTuple):
    """The fixed header of a v2 record batch, as stored (see the module docstring)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def compression(self) -> Compression:
        """The codec; raises ``ValueError`` for ids 5-7, which only unvalidated bytes carry."""
        return Compression(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & _TIMESTAMP_TYPE_BIT) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


class BatchInfo(NamedTuple):
    """What the produce path learns about one validated batch, without decoding records.

    Timestamps are the header's. ``base_timestamp`` is the *first* record's timestamp, which
    is the smallest one whenever a producer stamps records in order (every Kafka client does
    unless the application passes its own timestamps); the exact minimum would need every
    record decoded, which this path never does. ``max_timestamp`` is exact for create-time
    batches, the only kind :func:`split_and_validate` accepts (Kafka rejects producer batches
    marked log-append-time too: a log-append-time topic restamps batches on the broker).
    """

    position: int
    """Byte offset of the batch within the validated buffer."""
    size: int
    """Bytes of the whole batch."""
    record_count: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    """-1 unless the producer is idempotent."""
    producer_epoch: int
    base_sequence: int
    is_transactional: bool
    compression: Compression


def read_header(data: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header of the batch at ``position``; nothing is validated but its presence.

    Raises:
        BatchError: fewer than 61 bytes remain (``CORRUPT_MESSAGE``).
    """
    if len(data) - position < HEADER_SIZE or position < 0:
        raise BatchError(ErrorCode.corrupt_message, "record batch header is truncated")
    return BatchHeader._make(HEADER.unpack_from(data, position))


def with_log_append_time(batch: bytes | bytearray | memoryview, now_ms: int) -> bytearray:
    """A copy of one batch stamped with the broker's time, as Kafka stamps the batches of a
    topic whose ``message.timestamp.type`` is ``LogAppendTime``: the timestamp type bit set
    and the max timestamp ``now_ms`` (readers give every record of the batch that time), the
    CRC recomputed. Record timestamp deltas stay as the producer wrote them."""
    out = bytearray(batch)
    (attributes,) = struct.unpack_from(">h", out, ATTRIBUTES_AT)
    struct.pack_into(">h", out, ATTRIBUTES_AT, attributes | _LOG_APPEND_TIME_BIT)
    struct.pack_into(">q", out, MAX_TIMESTAMP_AT, now_ms)
    struct.pack_into(">I", out, CRC_AT, crc32c(memoryview(out)[ATTRIBUTES_AT:]))
    return out


def split_and_validate(records: bytes | memoryview, *, max_batch_bytes: int) -> list[BatchInfo]:
    """Split one partition's produce data into its batches and validate each, as Kafka does.

    Checks, per batch and in Kafka's order: the length is consistent, magic is 2, the base
    offset is 0, the batch fits ``max_batch_bytes``, the CRC-32C matches, the codec is known,
    the record count agrees with ``lastOffsetDelta``, it is not a control batch, an idempotent
    batch has a sequence, and its timestamps are create-time. Records are not decoded and
    compressed batches are not decompressed. Kafka (produce v3+) takes exactly one batch per
    partition; this accepts several, which costs nothing and suits the library API.

    Args:
        records: the ``records`` field of one partition of a Produce request.
        max_batch_bytes: the largest batch accepted (Kafka's ``max.message.bytes``).

    Returns:
        One :class:`BatchInfo` per batch, in order.

    Raises:
        BatchError: with the error code Kafka's broker returns for the same fault:
            ``CORRUPT_MESSAGE`` (truncated, bad length, magic outside 0-2, CRC mismatch),
            ``INVALID_RECORD`` (no batch, magic 0 or 1, non-zero base offset, record count
            inconsistent with ``lastOffsetDelta``, control batch, idempotent batch without a
            sequence), ``MESSAGE_TOO_LARGE``, ``UNSUPPORTED_COMPRESSION_TYPE`` (codec 5-7)
            or ``INVALID_TIMESTAMP`` (log-append-time set by the producer).
    """
    view = memoryview(records)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    total = len(view)
    if total == 0:
        raise BatchError(ErrorCode.invalid_record, "produce data holds no record batch")
    unpack_header = HEADER.unpack_from
    infos: list[BatchInfo] = []
    position = 0
    while position < total:
        if total - position < HEADER_SIZE:
            raise BatchError(
                ErrorCode.corrupt_message,
                f"record batch at byte {position} is truncated: {total - position} bytes "
                f"left, a header needs {HEADER_SIZE}",
            )
        (
            base_offset,
            batch_length,
            _leader_epoch,
            magic,
            crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        ) = unpack_header(view, position)
        size = batch_length + LOG_OVERHEAD
        if batch_length < MIN_BATCH_LENGTH or size > total - position:
            raise BatchError(
                ErrorCode.corrupt_message,
                f"record batch at byte {position} declares batchLength {batch_length}, but "
                f"{total - position - LOG_OVERHEAD} bytes follow (at least "
                f"{MIN_BATCH_LENGTH} needed)",
            )
        if magic != CURRENT_MAGIC:
            # Kafka: magic outside 0..2 is corrupt; 0 and 1 are real but obsolete formats,
            # refused for produce v3+ (the only versions Kafka 4 accepts).
            code = ErrorCode.invalid_record if magic in (0, 1) else ErrorCode.corrupt_message
            raise BatchError(code, f"record batch at byte {position} has magic {magic}, not 2")
        if base_offset != 0:
            raise BatchError(
                ErrorCode.invalid_record,
                f"record batch at byte {position} has base offset {base_offset}; a producer "
                "must send 0",
            )
        if size > max_batch_bytes:
            raise BatchError(
                ErrorCode.message_too_large,
                f"record batch at byte {position} is {size} bytes, over the limit of "
                f"{max_batch_bytes} (max.message.bytes)",
            )
        end = position + size
        if crc32c(view[position + ATTRIBUTES_AT : end]) != crc:
            raise BatchError(
                ErrorCode.corrupt_message,
                f"record batch at byte {position} fails its CRC-32C check",
            )
        codec = attributes & _CODEC_MASK
        if codec > Compression.ZSTD:
            raise BatchError(
                ErrorCode.unsupported_compression_type,
                f"record batch at byte {position} uses unknown compression codec id {codec}",
            )
        if record_count <= 0 or last_offset_delta != record_count - 1:
            raise BatchError(
                ErrorCode.invalid_record,
                f"record batch at byte {position} declares {record_count} records but "
                f"lastOffsetDelta {last_offset_delta}",
            )
        if attributes & _CONTROL_BIT:
            raise BatchError(
                ErrorCode.invalid_record,
                f"record batch at byte {position} is a control batch; clients may not write one",
            )
        if producer_id >= 0 and base_sequence < 0:
            raise BatchError(
                ErrorCode.invalid_record,
                f"record batch at byte {position} has producer id {producer_id} but base "
                f"sequence {base_sequence}",
            )
        if attributes & _TIMESTAMP_TYPE_BIT:
            raise BatchError(
                ErrorCode.invalid_timestamp,
                f"record batch at byte {position} is marked log-append-time; only the broker "
                "may set that",
            )
        infos.append(
            BatchInfo(
                position,
                size,
                record_count,
                base_timestamp,
                max_timestamp,
                producer_id,
                producer_epoch,
                base_sequence,
                bool(attributes & _TRANSACTIONAL_BIT),
                Compression(codec),
            )
        )
        position = end
    return infos


def patch_base_offsets(
    chunk: bytes | bytearray | memoryview,
    first_offset: int,
    *,
    partition_leader_epoch: int | None = None,
    verify_crc: bool = True,
) -> bytearray:
    """Copy a run of consecutive batches and write each batch's real base offset.

    The first batch gets ``first_offset``; each next one the previous base offset plus its
    ``lastOffsetDelta + 1``. To start at a later batch of a chunk, pass the slice that begins
    at that batch (its byte position is in the index's per-batch table) with its offset.

    Args:
        chunk: whole v2 batches, back to back (a WAL chunk or a part of one).
        first_offset: the offset of the first record of the first batch.
        partition_leader_epoch: also written into every batch when given (fetching Kafka
            clients compare it with the epoch they know); left as stored otherwise.
        verify_crc: check every batch's CRC-32C while copying (one more pass over the bytes,
            cheap with the hardware CRC); corrupt stored bytes are then never served.

    Returns:
        The patched copy.

    Raises:
        CorruptDataError: the bytes are not whole v2 batches, or a CRC does not match.
    """
    patched = bytearray(chunk)
    patch_base_offsets_into(
        patched,
        0,
        len(patched),
        first_offset,
        partition_leader_epoch=partition_leader_epoch,
        verify_crc=verify_crc,
    )
    return patched


def patch_base_offsets_into(
    buffer: bytearray | memoryview,
    start: int,
    end: int,
    first_offset: int,
    *,
    partition_leader_epoch: int | None = None,
    verify_crc: bool = True,
) -> int:
    """Patch, in place, the base offsets of the batches in ``buffer[start:end]``.

    For a reader that assembles a fetch response in one buffer of its own: copy the chunk in
    (or read it there), then patch that span. Same rules as :func:`patch_base_offsets`.

    Returns:
        The offset after the last record of the span: ``first_offset`` plus the records.

    Raises:
        CorruptDataError: the span is not whole v2 batches, or a CRC does not match.
    """
    view = memoryview(buffer)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    if not 0 <= start <= end <= len(view):
        raise ValueError(f"span [{start}, {end}) lies outside a buffer of {len(view)} bytes")
    read_length = _LENGTH_AND_EPOCH.unpack_from
    read_crc = _CRC_AND_DELTA.unpack_from
    write_offset = _I64.pack_into
    write_epoch = _I32.pack_into
    offset = first_offset
    position = start
    while position < end:
        if end - position < HEADER_SIZE:
            raise CorruptDataError(
                f"batch at byte {position - start} of the chunk is truncated: "
                f"{end - position} bytes left"
            )
        batch_length, _epoch, magic = read_length(view, position + LENGTH_AT)
        batch_end = position + LOG_OVERHEAD + batch_length
        if batch_length < MIN_BATCH_LENGTH or batch_end > end or magic != CURRENT_MAGIC:
            raise CorruptDataError(
                f"batch at byte {position - start} of the chunk has batchLength "
                f"{batch_length} and magic {magic}: not a whole v2 batch"
            )
        crc, _attributes, last_offset_delta = read_crc(view, position + CRC_AT)
        if verify_crc and crc32c(view[position + ATTRIBUTES_AT : batch_end]) != crc:
            raise CorruptDataError(
                f"batch at byte {position - start} of the chunk fails its CRC-32C check"
            )
        if last_offset_delta < 0:
            raise CorruptDataError(
                f"batch at byte {position - start} of the chunk has lastOffsetDelta "
                f"{last_offset_delta}"
            )
        write_offset(view, position + BASE_OFFSET_AT, offset)
        if partition_leader_epoch is not None:
            write_epoch(view, position + PARTITION_LEADER_EPOCH_AT, partition_leader_epoch)
        offset += last_offset_delta + 1
        position = batch_end
    return offset
