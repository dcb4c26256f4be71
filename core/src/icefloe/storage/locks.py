"""Per-key asyncio locks that do not accumulate."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable


class KeyedLocks:
    """One FIFO lock per key, forgotten when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, _KeyLock] = {}

    def hold(self, key: Hashable) -> _Holding:
        """``async with locks.hold(key):`` runs the block holding the key's lock."""
        return _Holding(self._locks, key)

    def __len__(self) -> int:
        """Keys held or waited for now."""
        return len(self._locks)


class _KeyLock:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.users = 0
        """Holders and waiters: the lock is forgotten when the last one leaves."""


class _Holding:
    # A class rather than an async generator: every produced batch takes two of these, and an
    # async generator costs several times as much to start and to finish.
    __slots__ = ("_key", "_locks")

    def __init__(self, locks: dict[Hashable, _KeyLock], key: Hashable) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        entry = self._locks.get(self._key)
        if entry is None:
            entry = self._locks[self._key] = _KeyLock()
        entry.users += 1
        try:
            await entry.lock.acquire()
        except BaseException:  # cancelled while waiting
            self._leave(entry)
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        entry = self._locks[self._key]
        entry.lock.release()
        self._leave(entry)

    def _leave(self, entry: _KeyLock) -> None:
        entry.users -= 1
        if entry.users == 0:
            del self._locks[self._key]
