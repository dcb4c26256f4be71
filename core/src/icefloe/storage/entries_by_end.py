"""Index entries of one stream kept in memory, sorted by end offset.

Entries of a stream never overlap, so the first one ending after an offset is the only one
that can hold it: one binary search finds it.
"""

from __future__ import annotations

import bisect

from icefloe.storage.index import IndexEntry


class EntriesByEnd:
    """Non-overlapping entries of one stream, sorted by end offset."""

    __slots__ = ("ends", "entries")

    def __init__(self) -> None:
        self.ends: list[int] = []
        self.entries: list[IndexEntry] = []

    def __len__(self) -> int:
        return len(self.entries)

    def holding(self, offset: int) -> IndexEntry | None:
        """The entry holding ``offset``, if any."""
        i = bisect.bisect_right(self.ends, offset)
        if i < len(self.entries) and self.entries[i].start <= offset:
            return self.entries[i]
        return None

    def ending_at(self, end: int) -> IndexEntry | None:
        i = bisect.bisect_left(self.ends, end)
        if i < len(self.ends) and self.ends[i] == end:
            return self.entries[i]
        return None

    def add(self, entry: IndexEntry) -> bool:
        """Add ``entry``; ``False`` (and nothing changes) if one with its end is present."""
        i = bisect.bisect_left(self.ends, entry.end)
        if i < len(self.ends) and self.ends[i] == entry.end:
            return False
        self.ends.insert(i, entry.end)
        self.entries.insert(i, entry)
        return True

    def remove_end(self, end: int) -> IndexEntry | None:
        """Remove the entry ending at ``end`` and return it, if there is one."""
        i = bisect.bisect_left(self.ends, end)
        if i < len(self.ends) and self.ends[i] == end:
            entry = self.entries[i]
            del self.ends[i]
            del self.entries[i]
            return entry
        return None
