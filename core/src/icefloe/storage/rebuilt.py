"""Kafka batches rebuilt from Parquet row groups, kept for the fetches that follow.

A consumer catching up asks for each partition's next megabyte or so, and a row group holds
about that much: without a cache, most row groups would be read and rebuilt twice (once for
the batches that fit in one fetch, again for the rest), and every consumer of a topic would
rebuild the same groups again. Groups are kept by bytes, and concurrent fetches of one group
share a single load.

What to let go matters when more partitions are catching up than the cache holds groups for:
a group pushed out before its fetch comes is rebuilt again, all cost and no gain. So groups
some fetch has read to their end go first, oldest first. Among the groups still in use (read
ahead, or read partly), the most recently used goes: a consumer visits its partitions in turn,
so the group it used last is the one it will want last. And groups are read ahead only while
the groups in use leave room for them and for :data:`DEMAND_LOADS` more, which fetches that
find their group not read ahead load themselves.

Entries never go stale: a data file's key names its stream and offset range, and a file is
written once; a file that is deleted simply stops being asked for.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

GroupKey = tuple[str, int]
"""(object key of the data file, row group)."""
DEMAND_LOADS = 2
"""Groups of room that reading ahead leaves for fetches loading their own. Measured with a
consumer catching up on 64 partitions (some 500 groups) through a cache of 32 MiB: with none
left, such loads pushed out about 100 groups read ahead before their fetch came."""


@dataclass(frozen=True, slots=True)
class RebuiltGroup:
    """The record batches of one row group, back to back, and where each one is."""

    data: bytes | memoryview
    positions: list[int]
    """Where each batch starts in ``data``, then ``len(data)``."""
    next_offsets: list[int]
    """The offset after each batch's last record."""

    @property
    def batch_count(self) -> int:
        return len(self.next_offsets)

    def first_batch_for(self, offset: int) -> int:
        """The index of the batch holding ``offset``, or of the first batch after it."""
        return bisect.bisect_right(self.next_offsets, offset)

    def batches_within(self, first: int, room: int, at_least_one: bool) -> int:
        """The index after the last batch from ``first`` on that fits in ``room`` bytes
        (``first`` itself whatever its size, if ``at_least_one``)."""
        limit = self.positions[first] + room
        last = bisect.bisect_right(self.positions, limit, lo=first) - 1
        if last == first and at_least_one and first < self.batch_count:
            return first + 1
        return last


class RebuiltGroups:
    """A byte-bounded cache of rebuilt row groups."""

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity = capacity_bytes
        self._in_use: OrderedDict[GroupKey, RebuiltGroup] = OrderedDict()
        """Groups not yet read to their end, least recently used first."""
        self._read: OrderedDict[GroupKey, RebuiltGroup] = OrderedDict()
        """Groups a fetch read to their end, oldest first: the first to go."""
        self._in_use_size = 0
        self._read_size = 0
        self._typical_size = 0
        """The size of the group kept last: what the next one will probably take."""
        self._loading: dict[GroupKey, asyncio.Future[RebuiltGroup]] = {}

    async def get(self, key: GroupKey, load: Callable[[], Awaitable[RebuiltGroup]]) -> RebuiltGroup:
        """The group ``key``: from the cache, from a load already under way, or ``load()``.
        It counts as in use until :meth:`read_to_end` says otherwise."""
        while (pending := self._loading.get(key)) is not None:
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The fetch that was loading the group was cancelled, not this one: load it.
        group = self._in_use.get(key)
        if group is not None:
            self._in_use.move_to_end(key)
            return group
        group = self._read.pop(key, None)
        if group is not None:  # read again, by another consumer
            self._read_size -= len(group.data)
            self._keep(key, group)
            return group
        future: asyncio.Future[RebuiltGroup] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            group = await load()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no warning when nobody else waited
            raise
        else:
            future.set_result(group)
            self._typical_size = len(group.data)
            self._keep(key, group)
            return group
        finally:
            del self._loading[key]

    def load_together(
        self,
        keys: list[GroupKey],
        load: Callable[[], Awaitable[list[RebuiltGroup]]],
        name: str,
    ) -> asyncio.Task[None]:
        """Start loading the groups ``keys`` (none of them held: :meth:`holds`) with one
        ``load()``, which returns them in order, in a task named ``name``, and keep them as in
        use. They count as under way from this call on, so that a fetch that wants one of them
        before the task runs waits for it rather than load it too. If the load fails or is
        cancelled, each fetch waiting loads its own group: a fault in one group fails only the
        fetches that want that group. The task's failure is for its caller to collect."""
        loop = asyncio.get_running_loop()
        futures: dict[GroupKey, asyncio.Future[RebuiltGroup]] = {}
        for key in keys:
            futures[key] = self._loading[key] = loop.create_future()
        task = loop.create_task(self._load_together(futures, load), name=name)
        task.add_done_callback(lambda _: self._loaded(futures))
        return task

    async def _load_together(
        self,
        futures: dict[GroupKey, asyncio.Future[RebuiltGroup]],
        load: Callable[[], Awaitable[list[RebuiltGroup]]],
    ) -> None:
        groups = await load()
        if len(groups) != len(futures):
            raise ValueError(f"{len(futures)} groups to load, {len(groups)} loaded")
        for (key, future), group in zip(futures.items(), groups, strict=True):
            future.set_result(group)
            self._typical_size = len(group.data)
            self._keep(key, group)

    def _loaded(self, futures: dict[GroupKey, asyncio.Future[RebuiltGroup]]) -> None:
        """A load together ended, even one cancelled before it started: the groups are no
        longer under way, and any it did not load are left to fetches."""
        for key, future in futures.items():
            future.cancel()  # what get() takes for "load it yourself"; nothing once loaded
            if self._loading.get(key) is future:
                del self._loading[key]

    def read_to_end(self, key: GroupKey) -> None:
        """A fetch took the last batch of ``key``: it goes before the groups still in use."""
        group = self._in_use.pop(key, None)
        if group is not None:
            self._in_use_size -= len(group.data)
            self._read[key] = group
            self._read_size += len(group.data)

    def holds(self, key: GroupKey) -> bool:
        """Whether ``key`` is cached or being loaded."""
        return key in self._in_use or key in self._read or key in self._loading

    def has_room_ahead(self, groups: int) -> bool:
        """Whether ``groups`` more groups (those being read ahead, and one to start) fit beside
        the groups in use, with room left for :data:`DEMAND_LOADS`."""
        needed = self._in_use_size + (groups + DEMAND_LOADS) * self._typical_size
        return needed <= self._capacity

    def _keep(self, key: GroupKey, group: RebuiltGroup) -> None:
        size = len(group.data)
        if size > self._capacity:
            return
        self._in_use[key] = group
        self._in_use_size += size
        while self._read and self.size > self._capacity:
            _, evicted = self._read.popitem(last=False)
            self._read_size -= len(evicted.data)
        if self.size <= self._capacity:
            return
        for other in list(reversed(self._in_use)):  # most recently used first
            if other != key:
                evicted = self._in_use.pop(other)
                self._in_use_size -= len(evicted.data)
                if self.size <= self._capacity:
                    return

    @property
    def size(self) -> int:
        return self._in_use_size + self._read_size
