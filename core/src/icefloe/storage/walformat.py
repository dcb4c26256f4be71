"""The WAL object format, version 1: its encoder and its decoder side by side.

A WAL object holds the record batches of many streams, sealed together. Layout, every
integer big-endian::

    header (36 bytes)
         0   8  magic               b"ICEFLWAL"
         8   2  version             1
        10   2  flags               0 (reserved; a reader refuses bits it does not know)
        12   8  created_ms          i64, when the object was sealed
        20   4  chunk_count         u32
        24   8  chunk_table_offset  u64, always 36 in version 1
        32   4  chunk_table_length  u32, chunk_count * 44
    chunk table: one 44-byte entry per chunk, in strictly increasing stream id order
         0   8  stream_id           u64
         8   8  position            u64, byte offset of the chunk in the object
        16   4  length              u32
        20   4  record_count        u32
        24   4  batch_count         u32
        28   8  min_timestamp       i64, smallest batch base timestamp (see below)
        36   8  max_timestamp       i64, largest batch max timestamp
    chunk bodies, in table order, back to back: each chunk is its stream's Kafka v2 record
        batches exactly as received (base offsets still the producer's 0), concatenated;
        batches are self-delimiting, so a chunk needs no framing of its own
    trailer (4 bytes): CRC-32C of every byte before it

Why no per-chunk checksum: a reader fetches one chunk with a single ranged read, knowing only
``(position, length)`` from the offset index, so it never sees the object's trailer. Each
batch already carries a CRC-32C over everything but its base offset, length, leader epoch and
magic; the base offset and leader epoch are rewritten on every read anyway, and walking the
chunk checks lengths and magic (:func:`verify_chunk`, or the ``verify_crc`` of
:func:`icefloe.storage.batch.patch_base_offsets`). A chunk CRC would cover nothing more.
The trailer CRC protects whole-object reads (compaction), including the header and table.

``min_timestamp`` is the smallest *base* timestamp (first record's) of the chunk's batches:
exact whenever producers stamp records in order, which Kafka clients do unless the
application supplies timestamps. Finding the true minimum would mean decoding every record.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from icefloe.errors import CorruptDataError
from icefloe.storage.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    CURRENT_MAGIC,
    HEADER,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MIN_BATCH_LENGTH,
)
from icefloe.storage.crc import crc32c

MAGIC: Final = b"ICEFLWAL"
FORMAT_VERSION: Final = 1

_HEADER: Final = struct.Struct(">8sHHqIQI")
_CHUNK_ENTRY: Final = struct.Struct(">QQIIIqq")
_TRAILER: Final = struct.Struct(">I")
"""The object's CRC-32C; batch CRCs have the same shape."""
HEADER_SIZE_V1: Final = _HEADER.size
CHUNK_ENTRY_SIZE: Final = _CHUNK_ENTRY.size
_U32_MAX: Final = 2**32 - 1
_U64_MAX: Final = 2**64 - 1


class BatchEntry(NamedTuple):
    """One record batch of a chunk: what the offset index keeps to seek inside the chunk."""

    offset_delta: int
    """The batch's first offset minus the chunk's first offset."""
    position: int
    """Byte position of the batch within the chunk."""
    length: int
    record_count: int
    min_timestamp: int
    """The batch's base timestamp (its first record's)."""
    max_timestamp: int


class ChunkEntry(NamedTuple):
    """One entry of the chunk table."""

    stream_id: int
    position: int
    """Byte offset of the chunk within the WAL object."""
    length: int
    record_count: int
    batch_count: int
    min_timestamp: int
    max_timestamp: int


class ChunkInput(NamedTuple):
    """One stream's share of a WAL object, as handed to :func:`encode_wal_object`."""

    stream_id: int
    batches: Sequence[bytes | bytearray | memoryview]
    """Byte runs in offset order, each one or more whole v2 batches (typically validated
    produce data, or single batches cut from it)."""


class EncodedChunk(NamedTuple):
    """Where a chunk landed, and its batches, for the offset-index entry."""

    entry: ChunkEntry
    batches: tuple[BatchEntry, ...]

    @property
    def stream_id(self) -> int:
        return self.entry.stream_id

    @property
    def position(self) -> int:
        """Byte offset of the chunk in the object: the start of its one ranged read."""
        return self.entry.position

    @property
    def length(self) -> int:
        return self.entry.length


@dataclass(frozen=True)
class EncodedWalObject:
    parts: tuple[bytes | memoryview, ...]
    """The object's bytes in order (header and table, the batches, the trailer), not joined:
    a WAL that writes them as they are (:meth:`~icefloe.ports.wal.WAL.append_parts`) copies
    each byte once, into the file."""
    size: int
    chunks: tuple[EncodedChunk, ...]
    """In chunk-table order: ascending stream id."""

    @functools.cached_property
    def data(self) -> bytes:
        """The object's bytes, joined (once, on first use)."""
        return b"".join(self.parts)


class WalObject(NamedTuple):
    """A decoded and verified WAL object; chunk bodies are views into ``data``."""

    data: memoryview
    created_ms: int
    chunks: tuple[ChunkEntry, ...]

    def chunk(self, entry: ChunkEntry) -> memoryview:
        """The bytes of one chunk of this object, without copying."""
        return self.data[entry.position : entry.position + entry.length]


def encode_wal_object(chunks: Iterable[ChunkInput], *, created_ms: int) -> EncodedWalObject:
    """Seal the batches of several streams into one WAL object.

    The payload is not copied: the result's parts are views of the batches. Batches are
    walked through their headers only, trusting the CRCs that the produce path already
    checked.

    Args:
        chunks: one input per stream, in any order; the table is sorted here.
        created_ms: the sealing time, milliseconds since the epoch.

    Returns:
        The object's bytes (as parts, and joined on demand) and, per chunk in table order,
        its table entry and per-batch table.

    Raises:
        ValueError: a stream id repeats or is outside u64, a stream has no batches, or a run
            is not whole v2 batches (a caller bug: the produce path validates batches first).
    """
    inputs = sorted(chunks, key=lambda chunk: chunk.stream_id)
    body_start = HEADER_SIZE_V1 + CHUNK_ENTRY_SIZE * len(inputs)
    position = body_start
    encoded: list[EncodedChunk] = []
    bodies: list[memoryview] = []
    previous_stream = -1
    for stream_id, runs in inputs:
        if stream_id == previous_stream:
            raise ValueError(f"stream {stream_id} has two chunks; merge its batches into one")
        if not 0 <= stream_id <= _U64_MAX:
            raise ValueError(f"stream id {stream_id} does not fit in 64 bits")
        previous_stream = stream_id
        views = [_byte_view(run) for run in runs]
        batches = _describe_batches(views)
        if not batches:
            raise ValueError(f"stream {stream_id} has no record batches")
        last = batches[-1]
        length = last.position + last.length
        entry = ChunkEntry(
            stream_id=stream_id,
            position=position,
            length=length,
            record_count=last.offset_delta + last.record_count,
            batch_count=len(batches),
            min_timestamp=min(batch.min_timestamp for batch in batches),
            max_timestamp=max(batch.max_timestamp for batch in batches),
        )
        if entry.length > _U32_MAX or entry.record_count > _U32_MAX:
            raise ValueError(f"stream {stream_id}'s chunk is too large for one WAL object")
        encoded.append(EncodedChunk(entry, tuple(batches)))
        bodies.extend(views)
        position += length

    header = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        0,
        created_ms,
        len(encoded),
        HEADER_SIZE_V1,
        CHUNK_ENTRY_SIZE * len(encoded),
    )
    table = b"".join(_CHUNK_ENTRY.pack(*chunk.entry) for chunk in encoded)
    checksum = crc32c(table, crc32c(header))
    for body in bodies:
        checksum = crc32c(body, checksum)
    parts: tuple[bytes | memoryview, ...] = (header + table, *bodies, _TRAILER.pack(checksum))
    return EncodedWalObject(parts, position + _TRAILER.size, tuple(encoded))


def _byte_view(run: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(run)
    return view if view.ndim == 1 and view.itemsize == 1 else view.cast("B")


def _describe_batches(runs: Iterable[memoryview]) -> list[BatchEntry]:
    batches: list[BatchEntry] = []
    offset_delta = 0
    chunk_position = 0
    for run in runs:
        position = 0
        while position < len(run):
            if len(run) - position < HEADER_SIZE:
                raise ValueError("a byte run ends inside a record batch header")
            header = HEADER.unpack_from(run, position)
            batch_length, magic, last_offset_delta = header[1], header[3], header[6]
            size = batch_length + LOG_OVERHEAD
            if batch_length < MIN_BATCH_LENGTH or size > len(run) - position:
                raise ValueError(f"a byte run holds a batch of bad length {batch_length}")
            if magic != CURRENT_MAGIC or last_offset_delta < 0:
                raise ValueError("a byte run holds something other than a v2 record batch")
            batches.append(
                BatchEntry(
                    offset_delta=offset_delta,
                    position=chunk_position + position,
                    length=size,
                    record_count=header[12],
                    min_timestamp=header[7],
                    max_timestamp=header[8],
                )
            )
            # Offsets advance by lastOffsetDelta + 1, which validated batches make equal to
            # their record count; the reader patches base offsets by the same rule.
            offset_delta += last_offset_delta + 1
            position += size
        chunk_position += len(run)
    return batches


def decode_wal_object(data: bytes | bytearray | memoryview) -> WalObject:
    """Verify a whole WAL object and read its chunk table.

    Checks the magic, version and flags, the trailer checksum, that the table is sorted by
    stream id, and that the chunks tile the body exactly; then walks every chunk's batch
    headers to check their framing and the table's counts and timestamps.

    Args:
        data: the complete object.

    Returns:
        The object with its chunk table; chunk bodies are views into ``data``.

    Raises:
        CorruptDataError: anything does not check out; the message says what.
    """
    view = _byte_view(data)
    size = len(view)
    if size < HEADER_SIZE_V1 + _TRAILER.size:
        raise CorruptDataError(f"WAL object is truncated: {size} bytes")
    magic, version, flags, created_ms, chunk_count, table_offset, table_length = (
        _HEADER.unpack_from(view)
    )
    if magic != MAGIC:
        raise CorruptDataError(f"not a WAL object: magic {bytes(magic)!r}")
    if version != FORMAT_VERSION:
        raise CorruptDataError(
            f"WAL object format version {version} is not supported (this reader knows "
            f"version {FORMAT_VERSION})"
        )
    (stored_checksum,) = _TRAILER.unpack_from(view, size - _TRAILER.size)
    body_end = size - _TRAILER.size
    if crc32c(view[:body_end]) != stored_checksum:
        raise CorruptDataError("WAL object fails its CRC-32C check")
    if flags != 0:
        raise CorruptDataError(f"WAL object has unknown flags {flags:#06x}")
    if table_offset != HEADER_SIZE_V1 or table_length != chunk_count * CHUNK_ENTRY_SIZE:
        raise CorruptDataError(
            f"WAL object chunk table at {table_offset} with {table_length} bytes does not "
            f"match {chunk_count} chunks"
        )
    body_start = table_offset + table_length
    if body_start > body_end:
        raise CorruptDataError("WAL object chunk table runs past the end of the object")
    chunks = tuple(
        ChunkEntry._make(_CHUNK_ENTRY.unpack_from(view, table_offset + i * CHUNK_ENTRY_SIZE))
        for i in range(chunk_count)
    )
    expected_position = body_start
    previous_stream = -1
    for chunk in chunks:
        if chunk.stream_id <= previous_stream:
            raise CorruptDataError(
                f"WAL object chunk table is not sorted: stream {chunk.stream_id} follows "
                f"{previous_stream}"
            )
        if chunk.position != expected_position or chunk.position + chunk.length > body_end:
            raise CorruptDataError(
                f"WAL object chunk of stream {chunk.stream_id} at [{chunk.position}, "
                f"{chunk.position + chunk.length}) overlaps, leaves a gap or runs past the end"
            )
        _check_chunk_matches(view[chunk.position : chunk.position + chunk.length], chunk)
        previous_stream = chunk.stream_id
        expected_position = chunk.position + chunk.length
    if expected_position != body_end:
        raise CorruptDataError(
            f"WAL object has {body_end - expected_position} bytes after its last chunk"
        )
    return WalObject(view, created_ms, chunks)


def _check_chunk_matches(chunk: memoryview, entry: ChunkEntry) -> None:
    try:
        batches = _describe_batches([chunk])
    except ValueError as exc:
        raise CorruptDataError(f"WAL chunk of stream {entry.stream_id}: {exc}") from None
    if not batches:
        raise CorruptDataError(f"WAL chunk of stream {entry.stream_id} is empty")
    last = batches[-1]
    found = (
        len(batches),
        last.offset_delta + last.record_count,
        min(batch.min_timestamp for batch in batches),
        max(batch.max_timestamp for batch in batches),
    )
    listed = (entry.batch_count, entry.record_count, entry.min_timestamp, entry.max_timestamp)
    if found != listed:
        raise CorruptDataError(
            f"WAL chunk of stream {entry.stream_id} holds (batches, records, min ts, max ts) "
            f"= {found}, its table entry says {listed}"
        )


def verify_chunk(chunk: bytes | bytearray | memoryview) -> tuple[BatchEntry, ...]:
    """Check one chunk read on its own (a ranged read) and describe its batches.

    Every batch's framing, magic and CRC-32C is checked; the base offsets, which the reader
    rewrites, are not looked at. A reader that also patches offsets can instead use
    :func:`icefloe.storage.batch.patch_base_offsets`, which checks the same while copying.

    Args:
        chunk: exactly the bytes ``[position, position + length)`` of a chunk.

    Returns:
        The chunk's per-batch table, as the encoder returned it.

    Raises:
        CorruptDataError: the bytes are not whole v2 batches with valid CRCs.
    """
    view = _byte_view(chunk)
    try:
        batches = _describe_batches([view])
    except ValueError as exc:
        raise CorruptDataError(f"WAL chunk: {exc}") from None
    if not batches:
        raise CorruptDataError("WAL chunk is empty")
    for batch in batches:
        (stored,) = _TRAILER.unpack_from(view, batch.position + CRC_AT)
        computed = crc32c(view[batch.position + ATTRIBUTES_AT : batch.position + batch.length])
        if computed != stored:
            raise CorruptDataError(
                f"WAL chunk batch at byte {batch.position} fails its CRC-32C check"
            )
    return tuple(batches)
