"""This process's most recent WAL objects, kept in memory so tail reads skip the WAL."""

from __future__ import annotations

from collections import OrderedDict


class RecentWalObjects:
    """A byte-bounded LRU of whole WAL objects by reference."""

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = capacity_bytes
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._size = 0

    def add(self, ref: str, data: bytes) -> None:
        if len(data) > self._capacity or ref in self._objects:
            return
        self._objects[ref] = data
        self._size += len(data)
        while self._size > self._capacity:
            _, evicted = self._objects.popitem(last=False)
            self._size -= len(evicted)

    def read(self, ref: str, start: int, end: int) -> memoryview | None:
        """Bytes ``[start, end)`` of ``ref`` without copying, or ``None`` if not held."""
        data = self._objects.get(ref)
        if data is None:
            return None
        self._objects.move_to_end(ref)
        return memoryview(data)[start:end]

    def discard(self, ref: str) -> None:
        data = self._objects.pop(ref, None)
        if data is not None:
            self._size -= len(data)

    @property
    def size(self) -> int:
        return self._size
