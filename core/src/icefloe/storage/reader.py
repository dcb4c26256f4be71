"""The read path: from an offset to Kafka record batches with their real offsets."""

from __future__ import annotations

from dataclasses import dataclass

from icefloe.errors import IcefloeError
from icefloe.ports.wal import WAL
from icefloe.storage import batch as batches
from icefloe.storage import records
from icefloe.storage.index import IndexEntry
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.recent import RecentWalObjects

MAX_ENTRIES_PER_READ = 64


class OffsetOutOfRange(IcefloeError):
    """The offset lies before the log start or beyond the log end."""

    def __init__(self, offset: int, log_start: int, log_end: int) -> None:
        super().__init__(f"offset {offset} is outside the log [{log_start}, {log_end})")
        self.offset = offset
        self.log_start = log_start
        self.log_end = log_end


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: bytes
    """Whole record batches, base offsets patched; the first holds the requested offset."""
    next_offset: int
    """The offset after the last record returned (the next read starts here)."""


class StreamReader:
    """Reads batches of any stream, from this process's recent WAL objects or the WAL."""

    def __init__(self, wal: WAL, index: IndexReader, recent: RecentWalObjects) -> None:
        self._wal = wal
        self._index = index
        self._recent = recent

    async def read(self, stream_id: int, offset: int, max_bytes: int) -> ReadResult:
        """Batches from ``offset`` on, up to ``max_bytes`` (but always one whole batch if any).

        As in Kafka, the first batch may start before ``offset`` (a batch is never split) and
        may exceed ``max_bytes`` so that a consumer always makes progress.

        Raises:
            OffsetOutOfRange: ``offset`` is before the log start or beyond the log end.
        """
        out = bytearray()
        position = offset
        for _ in range(MAX_ENTRIES_PER_READ):
            entry = await self._index.entry_for(stream_id, position)
            if entry is None or entry.start > position:
                if not out:
                    await self._check_range(stream_id, offset, entry)
                break
            chunk, next_offset, complete = await self._read_entry(
                entry, position, max_bytes - len(out), first=not out
            )
            out += chunk
            position = next_offset
            if not complete or len(out) >= max_bytes:
                break
        return ReadResult(bytes(out), position)

    async def _read_entry(
        self, entry: IndexEntry, offset: int, budget: int, *, first: bool
    ) -> tuple[bytes | bytearray, int, bool]:
        """Patched batches of one entry within ``budget``; ``complete`` if all were taken."""
        wanted = entry.batches_from(offset)
        taken = 0
        size = 0
        for ref in wanted:
            if size + ref.length > budget and not (first and taken == 0):
                break
            size += ref.length
            taken += 1
        if taken == 0:
            return b"", offset, False
        head, tail = wanted[0], wanted[taken - 1]
        start, end = head.position, tail.position + tail.length
        data = await self._read_chunk(entry, start, end)
        patched = batches.patch_base_offsets(data, entry.start + head.offset_delta)
        next_offset = entry.start + tail.offset_delta + tail.record_count
        return patched, next_offset, taken == len(wanted)

    async def _read_chunk(self, entry: IndexEntry, start: int, end: int) -> bytes | memoryview:
        location = entry.location
        first, last = location.position + start, location.position + end
        cached = self._recent.read(location.ref, first, last)
        if cached is not None:
            return cached
        return await self._wal.read(location.ref, first, last)

    async def _check_range(self, stream_id: int, offset: int, after: IndexEntry | None) -> None:
        if after is not None:  # the offset is before the first entry that holds data
            log_start = await self._index.log_start(stream_id)
            if offset < log_start:
                raise OffsetOutOfRange(offset, log_start, await self._index.log_end(stream_id))
            return
        log_end = await self._index.log_end(stream_id)
        if offset > log_end:
            raise OffsetOutOfRange(offset, await self._index.log_start(stream_id), log_end)

    async def offset_for_timestamp(self, stream_id: int, timestamp: int) -> int | None:
        """The earliest offset whose record timestamp is ``>= timestamp``, or ``None``."""
        for entry in await self._index.scan(stream_id):
            if entry.max_timestamp < timestamp:
                continue
            for ref in entry.batches:
                if ref.max_timestamp < timestamp:
                    continue
                data = await self._read_chunk(entry, ref.position, ref.position + ref.length)
                first_offset = entry.start + ref.offset_delta
                patched = batches.patch_base_offsets(data, first_offset)
                for record in records.decode_batch(patched)[1]:
                    if record.timestamp >= timestamp:
                        return record.offset
        return None
