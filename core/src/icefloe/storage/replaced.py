"""WAL entries that compaction replaced, kept aside for a while so reads can still use them.

A compaction swap puts one Parquet entry in place of a run of WAL entries. Their WAL objects
outlive the swap until garbage collection deletes them (past the orphan grace period), and
until then reading the producer's bytes costs a broker far less than rebuilding the same
batches from the data file: a consumer a few minutes behind reads as cheaply as one at the
tail. The records are the same either way (compaction keeps offsets, and drops only control
batches and aborted transactions, which a fetch from the WAL answers as it did before the
swap).

Only entries this process had cached and saw replaced are kept, and only while the data file
the swap put in place is still the record the swap wrote (same key, same version): a data file
that log compaction cleaned, maintenance merged or retention removed is a new record or none,
and its offsets are read from the tables again. A read that finds a kept entry's object gone
forgets the entry (:meth:`ReplacedWalEntries.forget`) and reads the data file.
"""

from __future__ import annotations

import time
from collections import deque

from icefloe.storage.entries_by_end import EntriesByEnd
from icefloe.storage.index import IndexEntry


class _Stream(EntriesByEnd):
    __slots__ = ("swaps",)

    def __init__(self) -> None:
        super().__init__()
        self.swaps: dict[int, int] = {}
        """The version of the Parquet entry each swap wrote, by its key's end offset."""


class ReplacedWalEntries:
    """Replaced WAL entries of every stream, each kept for ``keep_s`` seconds at most (none
    when 0); the owner bounds their number with :meth:`drop_oldest`."""

    def __init__(self, keep_s: float) -> None:
        self._keep_s = keep_s
        self._streams: dict[int, _Stream] = {}
        self._order: deque[tuple[float, int, int]] = deque()
        """(when kept, stream id, end offset) of each entry, oldest first."""
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def swapped(self, entry: IndexEntry, version: int) -> None:
        """``entry`` was replaced by the Parquet entry written under its key as ``version``
        (a swap writes its data file's entry under the key of the last entry it replaces)."""
        if self._keep_s <= 0:
            return
        stream = self._streams.setdefault(entry.stream_id, _Stream())
        stream.swaps[entry.end] = version
        self._keep(stream, entry)

    def deleted(self, entry: IndexEntry) -> None:
        """``entry`` was deleted: kept if a swap of its stream ends after it (it is one of the
        entries that swap replaced; retention's deletions have no swap to read them through)."""
        stream = self._streams.get(entry.stream_id)
        if stream is not None and any(end > entry.end for end in stream.swaps):
            self._keep(stream, entry)

    def find(self, offset: int, data_file: IndexEntry, version: int) -> IndexEntry | None:
        """The kept entry holding ``offset``, if ``data_file`` (the current entry holding it,
        read as ``version``) is the one its swap wrote."""
        stream = self._streams.get(data_file.stream_id)
        if stream is None or stream.swaps.get(data_file.end) != version:
            return None
        self.expire()
        entry = stream.holding(offset)
        if entry is None or entry.start < data_file.start or entry.end > data_file.end:
            return None
        return entry

    def forget(self, entry: IndexEntry) -> None:
        """Drop ``entry`` (its object is gone)."""
        stream = self._streams.get(entry.stream_id)
        if stream is not None:
            self._remove(entry.stream_id, stream, entry.end)

    def expire(self) -> None:
        """Drop the entries kept longer than ``keep_s``."""
        before = time.monotonic() - self._keep_s
        while self._order and self._order[0][0] < before:
            self.drop_oldest()

    def drop_oldest(self) -> None:
        _, stream_id, end = self._order.popleft()
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._remove(stream_id, stream, end)

    def clear(self) -> None:
        self._streams.clear()
        self._order.clear()
        self._count = 0

    def _keep(self, stream: _Stream, entry: IndexEntry) -> None:
        if stream.add(entry):
            self._order.append((time.monotonic(), entry.stream_id, entry.end))
            self._count += 1

    def _remove(self, stream_id: int, stream: _Stream, end: int) -> None:
        if stream.remove_end(end) is not None:
            self._count -= 1
        if not stream.entries:
            del self._streams[stream_id]
            return
        # A swap serves the entries up to its end: one below every kept entry serves none.
        for swap_end in [e for e in stream.swaps if e < stream.ends[0]]:
            del stream.swaps[swap_end]
