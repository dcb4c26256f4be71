"""The read path: from an offset to Kafka record batches with their real offsets."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from icefloe.cpu_affinity import on_every_core
from icefloe.errors import CorruptDataError, IcefloeError, LostDataError, NotFoundError
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.storage import batch as batches
from icefloe.storage import records
from icefloe.storage.coalesce import CoalescedReads
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.parquet_reader import ParquetRangeReader
from icefloe.storage.rebuild import rebuild_groups
from icefloe.storage.rebuilt import RebuiltGroup, RebuiltGroups
from icefloe.storage.recent import RecentWalObjects

MAX_ENTRIES_PER_READ = 64
ROW_GROUP_THREADS = 2
"""Threads that decode row groups and rebuild their batches, one hand-over per read: off the
event loop, and where the broker is pinned to one core, on every core the process had
(:func:`~icefloe.cpu_affinity.on_every_core`), so that a read ahead's work runs beside the
fetches the loop serves. Decoding lets the GIL go for most of its work, and the rebuild's Arrow
steps do too; more threads would mostly wait for it and for each other: measured on two cores,
two threads used a quarter less CPU per megabyte than the default pool."""
READ_AHEADS = 8
"""Reads ahead of the fetches that will want their row groups, at most, at once. A consumer
catching up asks for a partition's next group right after sending on its current one: read
ahead, the group is rebuilt while the response travels and the consumer works through it,
instead of while the consumer waits."""
READ_AHEAD_GROUPS = 4
"""Row groups of a file a read ahead rebuilds together. A decode and a rebuild each cost, whatever
their rows, about what the rows of a 1 MiB group cost: four groups at once take about a third
less CPU than one at a time."""

T = TypeVar("T")
log = logging.getLogger(__name__)
Buffer = bytes | bytearray | memoryview


class OffsetOutOfRange(IcefloeError):
    """The offset lies before the log start or beyond the log end."""

    def __init__(self, offset: int, log_start: int, log_end: int) -> None:
        super().__init__(f"offset {offset} is outside the log [{log_start}, {log_end})")
        self.offset = offset
        self.log_start = log_start
        self.log_end = log_end


@dataclass(eq=False, slots=True)
class _Chunk:
    """A WAL entry's batches being read: a ranged read of its object."""

    entry: IndexEntry
    first_offset: int
    """Where the read asked this entry for records (the first batch may start earlier)."""
    base_offset: int
    """The first batch's offset, patched into the bytes read."""
    next_offset: int
    """The offset after the last record read."""
    length: int
    whole_entry: bool
    """The batches reach the entry's end (no limit cut them)."""
    data: asyncio.Future[bytes | memoryview]
    read_for_us: bool
    """Read from the WAL for this read (and any read of the same bytes at the same moment),
    not a view of a cache: a writable buffer may be patched where it is."""


@dataclass(eq=False, slots=True)
class _Run:
    """The entries one look-ahead found: WAL chunks being read, then what stopped it."""

    chunks: list[_Chunk] = field(default_factory=list)
    lookups: int = 0
    parquet: IndexEntry | None = None
    """A Parquet entry came next: the caller reads it."""
    log_ends: bool = False
    """No entry holds the next offset; ``next_entry`` is the first after it, if any."""
    next_entry: IndexEntry | None = None
    limited: bool = False
    """A byte limit stopped the run: more records may follow."""


async def _land(chunks: list[_Chunk], pieces: _Pieces) -> _Chunk | None:
    """Add the chunks' bytes to ``pieces`` in order. A chunk whose object is gone stops it:
    that chunk is returned, and the reads after it are cancelled."""
    try:
        for i, chunk in enumerate(chunks):
            try:
                data = await chunk.data
            except NotFoundError:
                _cancel(chunks[i + 1 :])
                return chunk
            pieces.add(data, chunk.base_offset, chunk.read_for_us)
        return None
    except BaseException:
        _cancel(chunks)
        raise


class _Pieces:
    """The batches of one read, as the buffers they came in: joining them would copy every
    byte once more, and a buffer grown chunk by chunk is copied again each time it outgrows
    its memory."""

    __slots__ = ("_items", "size")

    def __init__(self) -> None:
        self._items: list[tuple[bytes | memoryview, int | None, bool]] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, data: bytes | memoryview, base_offset: int | None, own: bool = False) -> None:
        """Add batches; ``base_offset`` is patched into them from the first on (``None``: their
        offsets are right already); ``own``: ``data`` may be patched where it is."""
        self._items.append((data, base_offset, own))
        self.size += len(data)

    def mark(self) -> int:
        return len(self._items)

    def drop_from(self, mark: int) -> None:
        """Forget the pieces added since :meth:`mark` returned ``mark``."""
        del self._items[mark:]
        self.size = sum(len(data) for data, _, _ in self._items)

    def finish(self) -> tuple[Buffer, ...]:
        """The batches, base offsets patched: where they lie when they may be patched there
        (or need no patch), else a patched copy.

        Raises:
            CorruptDataError: a WAL chunk is not whole batches or fails its CRC.
        """
        parts: list[Buffer] = []
        for data, base_offset, own in self._items:
            if base_offset is None:
                parts.append(data)
                continue
            patched: bytearray | memoryview
            if own and isinstance(data, memoryview) and not data.readonly:
                patched = data
            else:
                patched = bytearray(data)
            batches.patch_base_offsets_into(patched, 0, len(patched), base_offset)
            parts.append(patched)
        return tuple(parts)


def joined(parts: Sequence[Buffer]) -> Buffer:
    """``parts`` in one buffer: a lone part as it is unless :func:`copy_small_views` would
    copy it, several joined into a new one."""
    if len(parts) == 1:
        only = [list(parts)]
        copy_small_views(only)
        return only[0][0]
    return bytearray().join(parts)


def copy_small_views(part_lists: Sequence[list[Buffer]]) -> None:
    """Copy, in place in the lists, the parts that view a buffer all the lists together use
    less than half of.

    A part may view a larger buffer: one ranged read serves the chunks of several partitions
    (and the gaps between them), a rebuilt row group serves many fetches. Whoever keeps the
    part keeps the whole buffer, while the broker's memory budget counts only the part; a
    buffer mostly used by the lists (a fetch response's partitions) is kept as it is.
    """
    used: dict[int, int] = {}
    for parts in part_lists:
        for part in parts:
            if isinstance(part, memoryview) and part.obj is not None:
                used[id(part.obj)] = used.get(id(part.obj), 0) + part.nbytes
    for parts in part_lists:
        parts[:] = [
            bytes(part)
            if isinstance(part, memoryview)
            and part.obj is not None
            and 2 * used[id(part.obj)] < memoryview(part.obj).nbytes
            else part
            for part in parts
        ]


def _cancel(chunks: list[_Chunk]) -> None:
    """Stop reads no one will wait for, and retrieve the errors of those already failed (so
    that none is reported as never retrieved)."""
    for chunk in chunks:
        if chunk.data.done():
            if not chunk.data.cancelled():
                chunk.data.exception()
        else:
            chunk.data.cancel()


@dataclass(frozen=True, slots=True)
class ReadResult:
    parts: tuple[Buffer, ...]
    """Whole record batches, base offsets patched, in the buffers they were read into (a
    response sends them from there); the first holds the requested offset. Parts may view
    larger buffers: see :func:`copy_small_views` before holding on to them."""
    next_offset: int
    """The offset after the last record returned (the next read starts here)."""
    truncated: bool = False
    """A limit stopped the read before the log end: more records may follow at
    ``next_offset`` (a long poll must not wait for records that are already there)."""
    size: int = field(init=False)
    """Bytes in all the parts."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", sum(len(part) for part in self.parts))

    @property
    def data(self) -> Buffer:
        """The batches in one buffer (a copy, unless they are one buffer already)."""
        return joined(self.parts)


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
        self._reads = CoalescedReads(wal)
        self._index = index
        self._recent = recent
        self._parquet = ParquetRangeReader(store)
        self._rebuilt = RebuiltGroups(rebuilt_cache_bytes)
        self._row_group_threads = ThreadPoolExecutor(
            ROW_GROUP_THREADS, thread_name_prefix="icefloe-row-groups", initializer=on_every_core
        )
        self._reading_ahead: dict[asyncio.Task[None], int] = {}
        """Reads ahead under way, and how many groups each rebuilds."""

    async def close(self) -> None:
        """Cancel the WAL reads in flight, the row groups being read ahead and the row group
        work not yet started."""
        await self._reads.close()
        for task in self._reading_ahead:
            task.cancel()
        await asyncio.gather(*self._reading_ahead, return_exceptions=True)
        self._row_group_threads.shutdown(wait=False, cancel_futures=True)

    async def read(self, stream_id: int, offset: int, max_bytes: int) -> ReadResult:
        """Batches from ``offset`` on, up to ``max_bytes`` (but always one whole batch if any).

        As in Kafka, the first batch may start before ``offset`` (a batch is never split) and
        may exceed ``max_bytes`` so that a consumer always makes progress.

        The chunks of consecutive WAL entries are read at once, not one after another: each
        is a ranged read of a different object, and on a remote store each costs a round
        trip. Reads of one object that other reads (of other streams) want at the same time
        are shared (:class:`CoalescedReads`).

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
        out = _Pieces()
        position = offset
        lookups = MAX_ENTRIES_PER_READ
        while lookups > 0:
            run = await self._start_run(stream_id, position, len(out), max_bytes, lookups)
            lookups -= run.lookups
            lost = await _land(run.chunks, out)
            if lost is not None:
                await self._check_replaced(lost.entry, lost.first_offset)
                position = lost.first_offset
                continue
            if run.chunks:
                position = run.chunks[-1].next_offset
            if run.parquet is not None:
                location = run.parquet.location
                assert isinstance(location, ParquetLocation)
                mark = out.mark()
                try:
                    position, complete = await self._read_parquet(
                        location, run.parquet.end, position, out, max_bytes
                    )
                except NotFoundError:
                    out.drop_from(mark)
                    await self._check_replaced(run.parquet, position)
                    continue
                if not complete or len(out) >= max_bytes:
                    break
                continue
            if run.log_ends:
                if not out:
                    await self._check_range(stream_id, offset, run.next_entry)
                return ReadResult(out.finish(), position)
            if run.limited:
                break
        return ReadResult(out.finish(), position, truncated=True)

    async def _start_run(
        self, stream_id: int, offset: int, size: int, max_bytes: int, lookups: int
    ) -> _Run:
        """Look up the entries from ``offset`` on and start reading the chunks of the WAL
        entries among them, until the batches reach ``max_bytes`` (``size`` are read
        already), the log or a WAL entry ends, or a Parquet entry comes (which the caller
        reads itself)."""
        run = _Run()
        try:
            while run.lookups < lookups:
                entry = await self._index.entry_for(stream_id, offset)
                run.lookups += 1
                if entry is None or entry.start > offset:
                    run.log_ends, run.next_entry = True, entry
                    return run
                if isinstance(entry.location, ParquetLocation):
                    replaced = self._index.replaced(offset, entry)
                    if replaced is None:
                        if size and entry.start < offset:
                            # Inside a data file, after replaced WAL entries that held its
                            # start: its batch holding ``offset`` may start before it (a
                            # rebuilt batch reaches over the offsets of a marker or aborted
                            # records), and only a response's first batch may. The next read
                            # starts here.
                            run.limited = True
                            return run
                        run.parquet = entry
                        return run
                    entry = replaced  # the producer's bytes, not a rebuild, while they last
                chunk = self._start_chunk(entry, offset, size, max_bytes)
                if chunk is None:
                    run.limited = True
                    return run
                run.chunks.append(chunk)
                size += chunk.length
                offset = chunk.next_offset
                if not chunk.whole_entry or size >= max_bytes:
                    run.limited = True
                    return run
            return run
        except BaseException:
            _cancel(run.chunks)
            raise

    def _start_chunk(
        self, entry: IndexEntry, offset: int, size: int, max_bytes: int
    ) -> _Chunk | None:
        """Start reading the batches of one WAL entry from ``offset`` that stay within
        ``max_bytes`` (``size`` are planned already; the first batch always, if none are);
        ``None`` if not one fits."""
        location = entry.location
        assert isinstance(location, WalLocation)
        wanted = entry.batches_from(offset)
        taken = 0
        for ref in wanted:
            if size + ref.length > max_bytes and size:
                break
            size += ref.length
            taken += 1
        if taken == 0:
            return None
        head, tail = wanted[0], wanted[taken - 1]
        first = location.position + head.position
        last = location.position + tail.position + tail.length
        cached = self._recent.read(location.ref, first, last)
        data: asyncio.Future[bytes | memoryview]
        if cached is not None:
            data = asyncio.get_running_loop().create_future()
            data.set_result(cached)
        else:
            data = self._reads.read(location.ref, first, last)
        return _Chunk(
            read_for_us=cached is None,
            entry=entry,
            first_offset=offset,
            base_offset=entry.start + head.offset_delta,
            next_offset=entry.start + tail.offset_delta + tail.record_count,
            length=last - first,
            whole_entry=taken == len(wanted),
            data=data,
        )

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

    async def _read_parquet(
        self, location: ParquetLocation, end: int, offset: int, out: _Pieces, max_bytes: int
    ) -> tuple[int, bool]:
        """Append the batches of a data file holding offsets up to ``end``, from ``offset`` on,
        to ``out`` while it stays within ``max_bytes`` (its first batch always, if ``out`` is
        empty). Log compaction may have removed any of its records: reading on from an offset
        it removed starts at the next record kept, a read to the file's last record ends at
        ``end``, and a read from past it takes an empty batch that ends there.

        Returns:
            The offset after the last record appended, and whether the file was read to its
            end.
        """
        groups = location.row_groups_from(offset)
        if not groups:
            # No record is left from ``offset`` to the file's end (a file of no rows: a range
            # of an aborted transaction and its marker; compaction left out aborted records
            # and markers, log compaction removed records): an empty batch over those
            # offsets moves the consumer's position past them. Without it, a read that finds
            # nothing after them (the log end, or an open transaction for read_committed)
            # would return nothing, and the consumer would stay where it is.
            out.add(records.empty_batch(offset, end), None)
            return end, True
        next_offset = offset
        for i, group in enumerate(groups):
            rebuilt = await self._rebuilt.get(
                (location.key, group), functools.partial(self._rebuild, location, group, end)
            )
            # A row group holds many batches: take those that fit (the first one always).
            first = rebuilt.first_batch_for(offset)
            after = rebuilt.batches_within(first, max_bytes - len(out), not out)
            if after > first:
                span = memoryview(rebuilt.data)[rebuilt.positions[first] : rebuilt.positions[after]]
                out.add(span, None)  # shared with other readers: never changed
                next_offset = rebuilt.next_offsets[after - 1]
            if after < rebuilt.batch_count:
                self._read_ahead(location, group + 1, end)
                return next_offset, False
            self._rebuilt.read_to_end((location.key, group))
            if _would_split_the_next(len(rebuilt.data), len(out), max_bytes):
                if i == len(groups) - 1:
                    return end, True
                self._read_ahead(location, group + 1, end)
                return next_offset, False
        return end, True

    def _read_ahead(self, location: ParquetLocation, group: int, end: int) -> None:
        """Rebuild the file's next groups, from ``group`` on, in the background: the first of
        the :data:`READ_AHEAD_GROUPS` from there that is neither rebuilt nor under way, and
        those after it up to as many, in one go. Unless there is none, :data:`READ_AHEADS`
        reads ahead are under way, or the cache has no room for the groups beside those in
        use. A failure is left for the fetch that wants a group to meet and report."""
        groups = self._groups_to_read_ahead(location, group)
        ahead = sum(self._reading_ahead.values())
        if (
            not groups
            or len(self._reading_ahead) >= READ_AHEADS
            or not self._rebuilt.has_room_ahead(ahead + len(groups))
        ):
            return
        task = self._rebuilt.load_together(
            [(location.key, g) for g in groups],
            functools.partial(self._rebuild_groups, location, groups, end),
            name=f"read-ahead {location.key}#{groups[0]}",
        )
        self._reading_ahead[task] = len(groups)
        task.add_done_callback(self._read_ahead_done)

    def _read_ahead_done(self, task: asyncio.Task[None]) -> None:
        del self._reading_ahead[task]
        if not task.cancelled() and (exc := task.exception()) is not None:
            # The fetch that wants a group meets the failure again, and reports it.
            log.debug("%s failed: %s", task.get_name(), exc)

    def _groups_to_read_ahead(self, location: ParquetLocation, group: int) -> list[int]:
        """The groups :meth:`_read_ahead` would rebuild from ``group`` on."""
        count = len(location.row_groups)
        for first in range(group, min(count, group + READ_AHEAD_GROUPS)):
            if not self._rebuilt.holds((location.key, first)):
                break
        else:
            return []
        groups = []
        for g in range(first, min(count, first + READ_AHEAD_GROUPS)):
            if self._rebuilt.holds((location.key, g)):
                break
            groups.append(g)
        return groups

    async def _rebuild(self, location: ParquetLocation, group: int, end: int) -> RebuiltGroup:
        """The batches of ``group``; the last group's reach to ``end``, the file's end."""
        return (await self._rebuild_groups(location, [group], end))[0]

    async def _rebuild_groups(
        self, location: ParquetLocation, groups: list[int], end: int
    ) -> list[RebuiltGroup]:
        """The batches of consecutive ``groups``, rebuilt together; the file's last group's
        reach to ``end``, the file's end."""
        last = groups[-1] == len(location.row_groups) - 1

        def rebuild(rows: pa.Table, group_rows: list[int]) -> list[RebuiltGroup]:
            return rebuild_groups(rows, group_rows, end_offset=end if last else None)

        return await self._from_row_groups(location, groups, rebuild)

    async def _from_row_groups(
        self,
        location: ParquetLocation,
        groups: list[int],
        work: Callable[[pa.Table, list[int]], T],
    ) -> T:
        """``work(rows of the groups, each group's row count)``, decoded and worked on in a
        row-group thread.

        Raises:
            NotFoundError: the file is gone.
            CorruptDataError: the file does not decode as the table row schema, or has not
                the row groups its index entry names.
        """
        try:
            fetched = await self._parquet.fetch(location.key, location.size, groups)
            group_rows = [fetched.metadata.row_group(g).num_rows for g in groups]

            def decode_and_work() -> T:
                return work(fetched.decode(), group_rows)

            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._row_group_threads, decode_and_work)
        except (pa.ArrowException, OSError, ValueError, LookupError, TypeError) as exc:
            which = ", ".join(str(g) for g in groups)
            raise CorruptDataError(
                f"{location.describe()}, row group {which}, does not decode: {exc}"
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
                found = await self._from_row_groups(
                    location,
                    [group],
                    lambda rows, _: _first_at_or_after(rows, timestamp, from_offset=floor),
                )
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


def _would_split_the_next(group_bytes: int, taken: int, max_bytes: int) -> bool:
    """Whether a read that has ``taken`` bytes of ``max_bytes``, the last of a group of
    ``group_bytes`` among them, stops before the next group. It stops once full, and also once
    half full if a next group as large would not fit whole: a fetch then takes whole groups,
    and a consumer catching up leaves no group read halfway in the cache for its next fetch (a
    group pushed out meanwhile would be rebuilt again)."""
    room = max_bytes - taken
    return room <= 0 or (room < group_bytes and taken >= max_bytes // 2)


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
