"""Finding offsets: index look-ups with a cache kept fresh by notifications, and long polls.

Index entries are immutable once appended (compaction replaces them under new keys and deletes
the old ones), so a cached entry is valid until a DELETE notification or a RESET evicts it. The
cache is never trusted for *absence*: an offset at or beyond what the cache knows is always
looked up in the metadata store, so a read after a produce acknowledgement sees the records
even before the notification arrives (read-your-writes). Cached WAL entries that compaction
replaced are kept aside for a while (:mod:`icefloe.storage.replaced`), within the same
capacity.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Iterable
from typing import Final

from icefloe import metrics
from icefloe.errors import CorruptDataError
from icefloe.keyspace import STREAMS
from icefloe.ports.metadata import EventKind, Follower, MetadataStore, WatchEvent
from icefloe.storage import index, keys
from icefloe.storage.entries_by_end import EntriesByEnd
from icefloe.storage.index import IndexEntry
from icefloe.storage.replaced import ReplacedWalEntries

log = logging.getLogger(__name__)

SCAN_PAGE = 1000
"""Index entries read per request when walking a stream's index."""
READ_AHEAD_ENTRIES: Final = 64
"""Entries read from the store on a cache miss: the one wanted and those after it."""
ENTRIES_PER_TURN: Final = 64
"""Entries a walk of an index decodes before it lets the event loop run other tasks: a page
decoded at once held the loop for tens of milliseconds (the compactor's planning walks every
stream's backlog in the WAL), and produce requests waited behind it."""


_CACHE_HITS: Final = metrics.INDEX_CACHE.labels("hit")
_CACHE_MISSES: Final = metrics.INDEX_CACHE.labels("miss")


class _StreamCache(EntriesByEnd):
    """Cached entries of one stream, with the store's version of each entry's record."""

    __slots__ = ("versions",)

    def __init__(self) -> None:
        super().__init__()
        self.versions: dict[int, int] = {}
        """By end offset."""

    def add_version(self, entry: IndexEntry, version: int) -> bool:
        if not self.add(entry):
            return False
        self.versions[entry.end] = version
        return True

    def version_of(self, entry: IndexEntry) -> int | None:
        """The version of the record ``entry`` was read as, if it is cached."""
        if self.ending_at(entry.end) == entry:
            return self.versions[entry.end]
        return None

    def evict_end(self, end: int, unless_version: int | None = None) -> IndexEntry | None:
        """Drop the entry ending at ``end`` and return it, unless its record has
        ``unless_version``."""
        if unless_version is not None and self.versions.get(end) == unless_version:
            return None
        entry = self.remove_end(end)
        if entry is not None:
            del self.versions[end]
        return entry


def encode_log_start(offset: int) -> bytes:
    return str(offset).encode()


def decode_log_start(value: bytes) -> int:
    """A stored log start; :class:`CorruptDataError` if the value is not one."""
    try:
        offset = int(value)
    except ValueError as exc:
        raise CorruptDataError(f"log start {value[:40]!r} is not a decimal offset") from exc
    if offset < 0:
        raise CorruptDataError(f"log start {offset} is negative")
    return offset


class IndexReader:
    """Look-ups in every stream's offset index, for one process.

    Call :meth:`start` to follow notifications (cache invalidation and long polls) and
    :meth:`close` when done.
    """

    def __init__(
        self, metadata: MetadataStore, cache_entries: int = 100_000, keep_replaced_s: float = 0.0
    ) -> None:
        self._metadata = metadata
        self._capacity = cache_entries
        self._streams: OrderedDict[int, _StreamCache] = OrderedDict()
        self._cached = 0
        self._replaced = ReplacedWalEntries(keep_replaced_s)
        """Replaced WAL entries, for :meth:`replaced`; they count against ``cache_entries``."""
        self._waiters: dict[int, set[asyncio.Event]] = {}
        self._ends: dict[int, int] = {}
        """The highest end offset seen per stream (this process's commits, notifications)."""
        self._starts: dict[int, int] = {}
        """Log starts read from the store, until an entry of the stream is removed."""
        self._floors: dict[int, int] = {}
        """Log starts set by DeleteRecords (0 where none is), read from the store, until a
        notification says the record changed."""
        self._dropped = 0
        """Counts the notifications that dropped starts or floors: a store read that one
        overtook may be stale, and is then not kept (no later notification would drop it)."""
        self._follower: Follower | None = None

    async def start(self) -> None:
        watch = await self._metadata.watch(STREAMS)
        self._follower = Follower(watch, self._apply, "index-notifications")

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
        self._wake_all()

    # --- look-ups -------------------------------------------------------------------------

    async def entry_for(self, stream_id: int, offset: int) -> IndexEntry | None:
        """The entry holding ``offset``, else the first entry after it, else ``None``.

        The first entry after ``offset`` is returned when ``offset`` lies before the log start
        (or in a hole left by retention), so callers can tell "too old" from "not yet written".
        """
        cache = self._streams.get(stream_id)
        if cache is not None:
            self._streams.move_to_end(stream_id)
            hit = cache.holding(offset)
            if hit is not None:
                _CACHE_HITS.inc()
                return hit
        _CACHE_MISSES.inc()
        # A miss is usually a reader catching up, who wants the entries after this one next:
        # they come in the same query, not one store round trip each.
        _, last = keys.index_range(stream_id)
        dropped = self._dropped
        records = await self._metadata.scan(
            keys.index_search_key(stream_id, offset + 1), last, limit=READ_AHEAD_ENTRIES
        )
        entries = [index.decode(record.key, record.value) for record in records]
        if self._dropped == dropped:
            # Not cached if entries were removed meanwhile (retention, a compaction swap):
            # their notifications are past, and nothing would take them out again.
            for entry, record in zip(entries, records, strict=True):
                self.remember(entry, record.version)
        return entries[0] if entries else None

    async def log_end(self, stream_id: int) -> int:
        """The log end offset (high watermark), read from the metadata store."""
        entry = await self.last_entry(stream_id)
        return 0 if entry is None else entry.end

    async def last_entry(self, stream_id: int) -> IndexEntry | None:
        first, last = keys.index_range(stream_id)
        record = await self._metadata.floor(last)
        if record is None or not first <= record.key < last:
            return None
        entry = index.decode(record.key, record.value)
        self.remember(entry, record.version)
        return entry

    async def first_entry(self, stream_id: int) -> IndexEntry | None:
        first, last = keys.index_range(stream_id)
        record = await self._metadata.ceiling(first)
        if record is None or not first <= record.key < last:
            return None
        entry = index.decode(record.key, record.value)
        self.remember(entry, record.version)
        return entry

    async def log_start(self, stream_id: int) -> int:
        """The log start, read from the store: the first offset still in the index (0 until
        retention removes entries), or the offset DeleteRecords moved it to, if later."""
        floor = await self.recorded_log_start(stream_id)
        entry = await self.first_entry(stream_id)
        if entry is None:
            # Nothing was ever written (retention always leaves the last entry). Not the log
            # end read now: a first batch that landed since the look-up would end there, and a
            # consumer starting from the earliest offset would skip it.
            return floor
        return max(floor, entry.start)

    async def recorded_log_start(self, stream_id: int) -> int:
        """The log start DeleteRecords set (``streams/<id>/log-start``), read from the store;
        0 if it never did. Records below it are unreadable even inside an index entry."""
        dropped = self._dropped
        record = await self._metadata.get(keys.log_start(stream_id))
        floor = 0 if record is None else decode_log_start(record.value)
        if self._dropped == dropped:
            self._floors[stream_id] = max(floor, self._floors.get(stream_id, 0))
        return floor

    async def log_start_floor(self, stream_id: int) -> int:
        """:meth:`recorded_log_start` as this process last read or wrote it: reads refuse
        offsets below it without a store round trip. Another process's DeleteRecords shows
        here one notification later."""
        floor = self._floors.get(stream_id)
        if floor is None:
            floor = await self.recorded_log_start(stream_id)
        return floor

    def log_start_moved(self, stream_id: int, offset: int) -> None:
        """This process moved the stream's log start to ``offset`` (its reads see it now)."""
        if offset > self._floors.get(stream_id, -1):
            self._floors[stream_id] = offset
        self._starts.pop(stream_id, None)

    def log_end_hint(self, stream_id: int) -> int | None:
        """The log end this process last saw, without asking the store, or ``None``.

        For answers that report the log end (a fetch response's high watermark), never for
        decisions: a commit through another broker shows here one notification later.
        """
        return self._ends.get(stream_id)

    def cached_log_start(self, stream_id: int) -> int | None:
        """What :meth:`log_start_hint` would answer without reading the store, or ``None``."""
        return self._starts.get(stream_id)

    async def log_start_hint(self, stream_id: int) -> int:
        """The log start as last read from the store; read again only after a notification
        says an entry of the stream was removed. For answers that report it, as above."""
        start = self._starts.get(stream_id)
        if start is None:
            dropped = self._dropped
            start = await self.log_start(stream_id)
            if self._dropped == dropped:
                self._starts[stream_id] = start
        return start

    async def entries(self, stream_id: int, after_end: int = 0) -> AsyncGenerator[IndexEntry, None]:
        """Every entry whose end offset is greater than ``after_end``, in order, read from the
        store a page at a time so a long index never sits in memory whole."""
        start, last = (
            keys.index_search_key(stream_id, after_end + 1),
            keys.index_range(stream_id)[1],
        )
        decoded = 0
        async for record in self._metadata.scan_all(start, last, page=SCAN_PAGE):
            yield index.decode(record.key, record.value)
            decoded += 1
            if decoded % ENTRIES_PER_TURN == 0:
                await asyncio.sleep(0)

    async def scan(self, stream_id: int, after_end: int = 0) -> list[IndexEntry]:
        """:meth:`entries` as a list, for callers that need them all at once."""
        return [entry async for entry in self.entries(stream_id, after_end)]

    def replaced(self, offset: int, data_file: IndexEntry) -> IndexEntry | None:
        """A WAL entry holding ``offset`` that compaction replaced with ``data_file`` (the
        entry holding it now, a Parquet one, as a look-up just returned it), if this process
        still keeps it; its object may be gone (see :mod:`icefloe.storage.replaced`)."""
        cache = self._streams.get(data_file.stream_id)
        version = None if cache is None else cache.version_of(data_file)
        if version is None:
            return None
        return self._replaced.find(offset, data_file, version)

    def forget(self, entry: IndexEntry) -> None:
        """Drop a cached entry that turned out stale (its WAL object is gone)."""
        cache = self._streams.get(entry.stream_id)
        if cache is not None and cache.evict_end(entry.end) is not None:
            self._cached -= 1
        self._replaced.forget(entry)

    def remember(self, entry: IndexEntry, version: int) -> None:
        """Add an entry read or written as the record of ``version`` to the cache (the
        writer calls this for its own commits)."""
        self.saw_end(entry.stream_id, entry.end)
        if self._capacity == 0:
            return
        cache = self._streams.get(entry.stream_id)
        if cache is None:
            cache = self._streams[entry.stream_id] = _StreamCache()
        self._streams.move_to_end(entry.stream_id)
        if cache.add_version(entry, version):
            self._cached += 1
            self._shrink()
        self._wake(entry.stream_id)

    def _shrink(self) -> None:
        # Replaced entries go first: they save work, the current ones save store trips.
        while self._cached + len(self._replaced) > self._capacity and len(self._replaced):
            self._replaced.drop_oldest()
        # Then the least recently used streams' oldest entries.
        while self._cached > self._capacity and self._streams:
            stream_id, cache = next(iter(self._streams.items()))
            if cache.entries:
                cache.evict_end(cache.ends[0])
                self._cached -= 1
            if not cache.entries:
                del self._streams[stream_id]

    # --- waiting for new data ---------------------------------------------------------------

    async def wait_for_data(self, positions: Iterable[tuple[int, int]], max_wait: float) -> bool:
        """Wait until any stream has data at or beyond its offset, or ``max_wait`` seconds.

        Args:
            positions: ``(stream id, offset)`` pairs: "wake me when ``offset`` exists".
            max_wait: Seconds to wait at most.

        Returns:
            Whether data arrived for at least one stream (``False`` on timeout).
        """
        positions = list(positions)
        event = asyncio.Event()
        for stream_id, _ in positions:
            self._waiters.setdefault(stream_id, set()).add(event)
        try:
            # Registered first, checked second: a commit between the two still wakes us.
            for stream_id, offset in positions:
                if await self.entry_for(stream_id, offset) is not None:
                    return True
            try:
                await asyncio.wait_for(event.wait(), max_wait)
            except TimeoutError:
                return False
            return True
        finally:
            for stream_id, _ in positions:
                waiters = self._waiters.get(stream_id)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[stream_id]

    def saw_end(self, stream_id: int, end: int) -> None:
        """Note a log end that a caller read from the store (the hint only moves forward)."""
        if end > self._ends.get(stream_id, -1):
            self._ends[stream_id] = end

    def _wake(self, stream_id: int) -> None:
        for event in self._waiters.get(stream_id, ()):
            event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    # --- notifications --------------------------------------------------------------------

    async def _apply(self, event: WatchEvent) -> None:
        if event.kind is EventKind.RESET:
            # Changes were missed: forget everything and let waiters re-check the store.
            self._dropped += 1
            self._streams.clear()
            self._replaced.clear()
            self._cached = 0
            self._ends.clear()
            self._starts.clear()
            self._floors.clear()
            self._wake_all()
            return
        if event.key is not None and keys.is_log_start_key(event.key):
            stream_id = keys.stream_of_key(event.key)
            self._dropped += 1
            self._floors.pop(stream_id, None)
            self._starts.pop(stream_id, None)
            return
        if event.key is None or not keys.is_index_key(event.key):
            return
        stream_id, end, _ = keys.parse_index_key(event.key)
        if event.kind is EventKind.PUT:
            self.saw_end(stream_id, end)
        else:
            self._dropped += 1
            self._starts.pop(stream_id, None)  # the first entry may be the one that went
        cache = self._streams.get(stream_id)
        # A deleted entry is gone; a rewritten one (compaction put a Parquet entry under the
        # key of the last WAL entry it replaces) is read again on next use. The notice of a
        # record the cache already holds (this process's own append) changes nothing.
        unchanged = event.version if event.kind is EventKind.PUT else None
        evicted = None if cache is None else cache.evict_end(end, unless_version=unchanged)
        if evicted is not None:
            self._cached -= 1
            if evicted.in_wal:
                if event.kind is EventKind.PUT:
                    assert event.version is not None
                    self._replaced.swapped(evicted, event.version)
                else:
                    self._replaced.deleted(evicted)
        self._wake(stream_id)
