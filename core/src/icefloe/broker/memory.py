"""The broker's memory for client data: one budget for the process, one cap per connection.

Every request frame the broker reads holds its bytes until its response is sent, and every
response holds its own; fetch responses are sized to the memory free when they are read. The
broker-wide budget is ``[broker] max_memory_bytes`` less what the caches and the WAL write
buffer are configured to hold (:func:`client_data_bytes`). When it is spent, no connection
reads its next frame until responses go out (back-pressure: clients wait, nothing grows), and
fetches shrink until, at worst, they answer empty and the consumer asks again.

A connection is capped at ``[broker] max_inflight_bytes`` as well, so that one client that
pipelines and never reads its answers holds at most that much.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Final

from icefloe.config.broker import BrokerOptions
from icefloe.config.storage import StorageOptions
from icefloe.errors import ConfigError

INDEX_ENTRY_BYTES: Final = 1100
"""Memory of one cached offset-index entry with two batches (measured with tracemalloc)."""
MIN_CLIENT_DATA_BYTES: Final = 16 << 20


def client_data_bytes(broker: BrokerOptions, storage: StorageOptions) -> int:
    """What ``max_memory_bytes`` leaves for requests and responses once the caches and the
    write buffer have their configured share.

    Raises:
        ConfigError: less than 16 MiB would be left.
    """
    fixed = {
        "[storage] wal_cache_bytes": storage.wal_cache_bytes,
        "[storage] rebuilt_cache_bytes": storage.rebuilt_cache_bytes,
        "[storage] index_cache_entries": storage.index_cache_entries * INDEX_ENTRY_BYTES,
        "sealed WAL objects ([storage] flush_bytes x max_inflight_flushes)": (
            storage.largest_flush_bytes * storage.max_inflight_flushes
        ),
    }
    left = broker.max_memory_bytes - sum(fixed.values())
    if left < MIN_CLIENT_DATA_BYTES:
        shares = ", ".join(f"{name} {size >> 20} MiB" for name, size in fixed.items())
        raise ConfigError(
            f"[broker] max_memory_bytes ({broker.max_memory_bytes >> 20} MiB) leaves "
            f"{max(left, 0) >> 20} MiB for client data after {shares}; raise it or shrink "
            f"those (at least {MIN_CLIENT_DATA_BYTES >> 20} MiB must be left)"
        )
    return left


class ByteBudget:
    """Bytes held against a limit; takers wait while it is spent.

    A taker waits until its bytes fit, or until nothing at all is held (so that one request
    larger than the whole limit still passes, alone, instead of waiting forever).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def free(self) -> int:
        return max(0, self.limit - self.used)

    async def take(self, size: int) -> None:
        while self.used and self.used + size > self.limit:
            await self._freed()
        self.used += size

    def add(self, size: int) -> None:
        """Count bytes that are already in memory (a response built): no waiting."""
        self.used += size

    async def wait_for_free(self, size: int, wait_s: float) -> None:
        """Wait until ``size`` bytes are free, for at most ``wait_s`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while self.free < size and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed(), left)

    def give_back(self, size: int) -> None:
        self.used -= size
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _freed(self) -> asyncio.Future[None]:
        """A future that completes at the next :meth:`give_back`."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter


class Held:
    """What one request holds in its connection's and the broker's budgets until its response
    is sent: its frame, then its response (a fetch sizes its response to what is free)."""

    __slots__ = ("_broker", "_connection", "_holds", "_released", "for_response", "size")

    def __init__(self, connection: ByteBudget, broker: ByteBudget, holds: set[Held]) -> None:
        self._connection = connection
        self._broker = broker
        self._holds = holds
        self._released = False
        self.size = 0
        self.for_response = 0
        """Bytes taken ahead for the response (see :meth:`take_up_to`)."""
        holds.add(self)

    async def take(self, size: int) -> None:
        """Wait for room in both budgets, then hold ``size`` more bytes."""
        await self._connection.take(size)
        try:
            await self._broker.take(size)
        except BaseException:
            self._connection.give_back(size)
            raise
        self._hold(size)

    async def take_up_to(self, wanted: int, least: int, wait_s: float) -> int:
        """Hold, for the response, as much of ``wanted`` as is free, after waiting up to
        ``wait_s`` seconds for ``least`` to be; returns what is held (0: nothing was free)."""
        least = min(wanted, least)
        if self._free() < least:
            await self._broker.wait_for_free(least, wait_s)
        if self._released:
            return 0
        granted = min(wanted, self._free())
        if granted > 0:
            self._connection.add(granted)
            self._broker.add(granted)
            self.size += granted
            self.for_response += granted
        return granted

    def settle(self, granted: int, used: int) -> None:
        """After reading into a grant of :meth:`take_up_to`: give back what the read left, or
        hold what it took beyond (a whole first batch may exceed its limit)."""
        if used > granted:
            self._connection.add(used - granted)
            self._broker.add(used - granted)
            self._hold(used - granted)
        elif used < granted and not self._released:
            unused = granted - used
            self.size -= unused
            self._connection.give_back(unused)
            self._broker.give_back(unused)
        self.for_response += used - granted

    def add_response(self, size: int) -> None:
        """Hold a built response of ``size`` bytes (beyond what was taken ahead for it)."""
        extra = size - self.for_response
        if extra > 0 and not self._released:
            self._connection.add(extra)
            self._broker.add(extra)
            self._hold(extra)

    def release(self) -> None:
        """Give everything back; idempotent, and nothing is held after it."""
        if self._released:
            return
        self._released = True
        self._holds.discard(self)
        if self.size:
            self._connection.give_back(self.size)
            self._broker.give_back(self.size)
            self.size = 0

    def _hold(self, size: int) -> None:
        if self._released:  # the connection closed meanwhile: give it straight back
            self._connection.give_back(size)
            self._broker.give_back(size)
        else:
            self.size += size

    def _free(self) -> int:
        return min(self._connection.free, self._broker.free)
