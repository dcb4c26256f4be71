"""The read path: from an offset to Kafka record batches with their real offsets."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.compaction.parquet import rebuild_batches
from icefloe.compaction.parquet_reader import ParquetRangeReader
from icefloe.errors import IcefloeError, NotFoundError
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.storage import batch as batches
from icefloe.storage import records
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
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
    """Reads batches of any stream: from this process's recent WAL objects, the WAL, or the
    compacted Parquet files."""

    def __init__(
        self, wal: WAL, store: ObjectStore, index: IndexReader, recent: RecentWalObjects
    ) -> None:
        self._wal = wal
        self._index = index
        self._recent = recent
        self._parquet = ParquetRangeReader(store)

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
            try:
                chunk, next_offset, complete = await self._read_entry(
                    entry, position, max_bytes - len(out), first=not out
                )
            except NotFoundError:
                # Compaction replaced the entry and its WAL object is gone: look it up again.
                self._index.forget(entry)
                continue
            out += chunk
            position = next_offset
            if not complete or len(out) >= max_bytes:
                break
        return ReadResult(bytes(out), position)

    async def _read_entry(
        self, entry: IndexEntry, offset: int, budget: int, *, first: bool
    ) -> tuple[bytes | bytearray, int, bool]:
        """Batches of one entry from ``offset`` within ``budget``; ``complete`` if all were
        taken. The first batch of a read is taken even if it exceeds the budget."""
        if isinstance(entry.location, ParquetLocation):
            return await self._read_parquet(entry.location, offset, budget, first=first)
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

    async def _read_parquet(
        self, location: ParquetLocation, offset: int, budget: int, *, first: bool
    ) -> tuple[bytes | bytearray, int, bool]:
        out = bytearray()
        groups = location.row_groups_from(offset)
        next_offset = offset
        for i, group in enumerate(groups):
            table = await self._parquet.read_row_groups(location.key, location.size, [group])
            rebuilt = rebuild_batches(_from_batch_holding(table, offset))
            if len(out) + len(rebuilt) > budget and (out or not first):
                return out, next_offset, False
            out += rebuilt
            next_offset = location.row_groups[group][1] + 1
            if len(out) >= budget:
                return out, next_offset, i == len(groups) - 1
        return out, next_offset, True

    async def _read_chunk(self, entry: IndexEntry, start: int, end: int) -> bytes | memoryview:
        location = entry.location
        assert isinstance(location, WalLocation)
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
        async for entry in self._index.entries(stream_id):
            if entry.max_timestamp < timestamp:
                continue
            if isinstance(entry.location, ParquetLocation):
                found = await self._parquet_offset_for_timestamp(entry.location, timestamp)
                if found is not None:
                    return found
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

    async def _parquet_offset_for_timestamp(
        self, location: ParquetLocation, timestamp: int
    ) -> int | None:
        for group in range(len(location.row_groups)):
            table = await self._parquet.read_row_groups(location.key, location.size, [group])
            micros = pc.cast(table.column("timestamp"), pa.int64())
            hits = pc.filter(table.column("offset"), pc.greater_equal(micros, timestamp * 1000))
            if len(hits):
                return int(hits[0].as_py())
        return None


def _from_batch_holding(table: pa.Table, offset: int) -> pa.Table:
    """The rows of ``table`` from the batch holding ``offset`` on (batches are never split)."""
    offsets = table.column("offset")
    later = pc.greater_equal(offsets, offset)
    if not pc.any(later).as_py():
        return table.slice(0, 0)
    first_row = int(pc.index(later, True).as_py())
    base = table.column("batch_base_offset")[first_row]
    return table.filter(pc.greater_equal(table.column("batch_base_offset"), base))
