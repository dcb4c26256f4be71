"""The read path: from an offset to Kafka record batches with their real offsets."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.errors import CorruptDataError, IcefloeError, LostDataError, NotFoundError
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.storage import batch as batches
from icefloe.storage import records
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.parquet_reader import ParquetRangeReader
from icefloe.storage.rebuild import rebuild_batches
from icefloe.storage.rebuilt import RebuiltGroup, RebuiltGroups
from icefloe.storage.recent import RecentWalObjects

MAX_ENTRIES_PER_READ = 64

T = TypeVar("T")


class OffsetOutOfRange(IcefloeError):
    """The offset lies before the log start or beyond the log end."""

    def __init__(self, offset: int, log_start: int, log_end: int) -> None:
        super().__init__(f"offset {offset} is outside the log [{log_start}, {log_end})")
        self.offset = offset
        self.log_start = log_start
        self.log_end = log_end


@dataclass(frozen=True, slots=True)
class ReadResult:
    data: bytes | bytearray
    """Whole record batches, base offsets patched; the first holds the requested offset."""
    next_offset: int
    """The offset after the last record returned (the next read starts here)."""
    truncated: bool = False
    """A limit stopped the read before the log end: more records may follow at
    ``next_offset`` (a long poll must not wait for records that are already there)."""


class StreamReader:
    """Reads batches of any stream: from this process's recent WAL objects, the WAL, or the
    compacted Parquet files."""

    def __init__(
        self,
        wal: WAL,
        store: ObjectStore,
        index: IndexReader,
        recent: RecentWalObjects,
        rebuilt_cache_bytes: int,
    ) -> None:
        self._wal = wal
        self._index = index
        self._recent = recent
        self._parquet = ParquetRangeReader(store)
        self._rebuilt = RebuiltGroups(rebuilt_cache_bytes)

    async def read(self, stream_id: int, offset: int, max_bytes: int) -> ReadResult:
        """Batches from ``offset`` on, up to ``max_bytes`` (but always one whole batch if any).

        As in Kafka, the first batch may start before ``offset`` (a batch is never split) and
        may exceed ``max_bytes`` so that a consumer always makes progress.

        Raises:
            OffsetOutOfRange: ``offset`` is before the log start or beyond the log end.
        """
        if offset < await self._index.log_start_floor(stream_id):
            # Deleted by DeleteRecords, though an index entry may still hold it.
            raise OffsetOutOfRange(
                offset,
                await self._index.log_start(stream_id),
                await self._index.log_end(stream_id),
            )
        out = bytearray()
        position = offset
        for _ in range(MAX_ENTRIES_PER_READ):
            entry = await self._index.entry_for(stream_id, position)
            if entry is None or entry.start > position:
                if not out:
                    await self._check_range(stream_id, offset, entry)
                return ReadResult(out, position)
            mark = len(out)
            try:
                position, complete = await self._read_entry(entry, position, out, max_bytes)
            except NotFoundError:
                del out[mark:]
                await self._check_replaced(entry, position)
                continue
            if not complete or len(out) >= max_bytes:
                break
        return ReadResult(out, position, truncated=True)

    async def _check_replaced(self, entry: IndexEntry, position: int) -> None:
        """The object of a cached ``entry`` is gone: fine if compaction replaced the entry.

        Raises:
            LostDataError: the index still names the object; its records cannot be read.
        """
        self._index.forget(entry)
        current = await self._index.entry_for(entry.stream_id, position)
        if current is not None and current.location == entry.location:
            raise LostDataError(
                f"stream {entry.stream_id}: offsets [{entry.start}, {entry.end}) are in "
                f"{entry.location.describe()}, which is missing from the object store"
            )

    async def _read_entry(
        self, entry: IndexEntry, offset: int, out: bytearray, max_bytes: int
    ) -> tuple[int, bool]:
        """Append the batches of one entry from ``offset`` to ``out`` while it stays within
        ``max_bytes`` (its first batch always, if ``out`` is empty).

        Returns:
            The offset after the last record appended, and whether the entry was read to its
            end.
        """
        if isinstance(entry.location, ParquetLocation):
            return await self._read_parquet(entry.location, entry.end, offset, out, max_bytes)
        wanted = entry.batches_from(offset)
        taken = 0
        size = len(out)
        for ref in wanted:
            if size + ref.length > max_bytes and size:
                break
            size += ref.length
            taken += 1
        if taken == 0:
            return offset, False
        head, tail = wanted[0], wanted[taken - 1]
        data = await self._read_chunk(entry, head.position, tail.position + tail.length)
        # Copied once, into the response, and patched there.
        mark = len(out)
        out += data
        batches.patch_base_offsets_into(out, mark, len(out), entry.start + head.offset_delta)
        return entry.start + tail.offset_delta + tail.record_count, taken == len(wanted)

    async def _read_parquet(
        self, location: ParquetLocation, end: int, offset: int, out: bytearray, max_bytes: int
    ) -> tuple[int, bool]:
        """As :meth:`_read_entry`, for a data file holding offsets up to ``end``. Log
        compaction may have removed any of its records: reading on from an offset it removed
        starts at the next record kept, and a read to the file's last record (or from past
        it) ends at ``end``."""
        groups = location.row_groups_from(offset)
        next_offset = offset
        last_group = len(location.row_groups) - 1
        for i, group in enumerate(groups):
            rebuilt = await self._rebuilt.get(
                (location.key, group),
                functools.partial(
                    self._rebuild, location, group, end if group == last_group else None
                ),
            )
            # A row group holds many batches: take those that fit (the first one always).
            first = rebuilt.first_batch_for(offset)
            after = rebuilt.batches_within(first, max_bytes - len(out), not out)
            if after > first:
                out += memoryview(rebuilt.data)[rebuilt.positions[first] : rebuilt.positions[after]]
                next_offset = rebuilt.next_offsets[after - 1]
            if after < rebuilt.batch_count:
                return next_offset, False
            if len(out) >= max_bytes:
                return (end, True) if i == len(groups) - 1 else (next_offset, False)
        return end, True

    async def _rebuild(
        self, location: ParquetLocation, group: int, end: int | None
    ) -> RebuiltGroup:
        return await self._from_row_group(
            location, group, functools.partial(_rebuild_group, end_offset=end)
        )

    async def _from_row_group(
        self, location: ParquetLocation, group: int, work: Callable[[pa.Table], T]
    ) -> T:
        """``work(rows of the group)``, run off the event loop: it is per-row CPU work.

        Raises:
            NotFoundError: the file is gone.
            CorruptDataError: the file does not decode as the table row schema.
        """
        try:
            table = await self._parquet.read_row_groups(location.key, location.size, [group])
            return await asyncio.to_thread(work, table)
        except (pa.ArrowException, OSError, ValueError, KeyError, TypeError) as exc:
            raise CorruptDataError(
                f"{location.describe()}, row group {group}, does not decode: {exc}"
            ) from exc

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
        """The earliest offset at or after the log start whose record timestamp is
        ``>= timestamp``, or ``None``.

        Raises:
            LostDataError, CorruptDataError: a stored object the search needs is unreadable.
        """
        floor = await self._index.recorded_log_start(stream_id)
        for _ in range(MAX_ENTRIES_PER_READ):
            async for entry in self._index.entries(stream_id, after_end=floor):
                if entry.max_timestamp < timestamp:
                    continue
                try:
                    found = await self._offset_for_timestamp_in(entry, timestamp, floor)
                except NotFoundError:
                    await self._check_replaced(entry, entry.start)
                    break  # compaction replaced the entry meanwhile: search again
                if found is not None:
                    return found
            else:
                return None
        return None

    async def _offset_for_timestamp_in(
        self, entry: IndexEntry, timestamp: int, floor: int
    ) -> int | None:
        location = entry.location
        if isinstance(location, ParquetLocation):
            for group, (_, last) in enumerate(location.row_groups):
                if last < floor:
                    continue
                search = functools.partial(
                    _first_at_or_after, timestamp_ms=timestamp, from_offset=floor
                )
                found = await self._from_row_group(location, group, search)
                if found is not None:
                    return found
            return None
        for ref in entry.batches:
            if (
                ref.max_timestamp < timestamp
                or entry.start + ref.offset_delta + ref.record_count <= floor
            ):
                continue
            data = await self._read_chunk(entry, ref.position, ref.position + ref.length)
            patched = batches.patch_base_offsets(data, entry.start + ref.offset_delta)
            for record in records.decode_batch(patched)[1]:
                if record.timestamp >= timestamp and record.offset >= floor:
                    return record.offset
        return None


def _first_at_or_after(table: pa.Table, timestamp_ms: int, from_offset: int = 0) -> int | None:
    """The offset of the first row at or after ``timestamp_ms`` and ``from_offset``, if any."""
    micros = pc.cast(table.column("timestamp"), pa.int64())
    offsets = table.column("offset")
    wanted = pc.and_(
        pc.greater_equal(micros, timestamp_ms * 1000),
        pc.greater_equal(pc.cast(offsets, pa.int64()), from_offset),
    )
    hits = pc.filter(offsets, wanted)
    return int(hits[0].as_py()) if len(hits) else None


def _rebuild_group(table: pa.Table, end_offset: int | None = None) -> RebuiltGroup:
    return RebuiltGroup.of(rebuild_batches(table, end_offset))
