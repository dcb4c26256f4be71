"""The cache of batches rebuilt from row groups: where each batch is, what fits in a fetch, a
bound on bytes (groups read to their end go first), room for reading ahead, and one load per
group however many fetches want it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from icefloe.storage.rebuilt import DEMAND_LOADS, RebuiltGroup, RebuiltGroups
from icefloe.storage.records import Record, build_batch
from tests.support.rebuilt_groups import parsed_group


def group_of(*sizes: int, first_offset: int = 100) -> RebuiltGroup:
    """Batches of ``sizes`` records each, offsets from ``first_offset`` on."""
    data = bytearray()
    offset = first_offset
    for count in sizes:
        batch = bytearray(build_batch([Record(i, 0, None, b"v" * 10) for i in range(count)]))
        batch[0:8] = offset.to_bytes(8, "big")  # the base offset, as the rebuild writes it
        data += batch
        offset += count
    return parsed_group(bytes(data))


def test_batches_are_found_by_offset() -> None:
    group = group_of(3, 2, 4)  # offsets 100-102, 103-104, 105-108
    assert group.next_offsets == [103, 105, 109]
    assert [group.first_batch_for(o) for o in (0, 100, 102, 103, 104, 108, 109)] == [
        0,
        0,
        0,
        1,
        1,
        2,
        3,
    ]


def test_only_whole_batches_that_fit_are_taken_but_always_one() -> None:
    group = group_of(3, 2, 4)
    sizes = [b - a for a, b in zip(group.positions, group.positions[1:], strict=False)]
    assert group.batches_within(0, sizes[0] + sizes[1], at_least_one=False) == 2
    assert group.batches_within(0, sizes[0] + sizes[1] - 1, at_least_one=False) == 1
    assert group.batches_within(1, 1, at_least_one=False) == 1
    assert group.batches_within(1, 1, at_least_one=True) == 2
    assert group.batches_within(0, 1 << 20, at_least_one=False) == 3
    assert group.batches_within(3, 1 << 20, at_least_one=True) == 3


async def test_the_cache_keeps_to_its_bound_evicting_the_group_in_use_used_last() -> None:
    group = group_of(5)
    cache = RebuiltGroups(capacity_bytes=2 * len(group.data))
    loads: list[str] = []

    async def load(name: str) -> RebuiltGroup:
        loads.append(name)
        return group

    for name in ("a", "b", "a", "c", "b", "a"):
        await cache.get((name, 0), lambda name=name: load(name))
    assert loads == ["a", "b", "c", "a"]  # c pushed a out, used just before it; b stayed
    assert cache.size == 2 * len(group.data)


class Loads:
    """Loads of one group under different names, and the names loaded, in order."""

    def __init__(self) -> None:
        self.group = group_of(5)
        self.names: list[str] = []

    def of(self, name: str) -> Callable[[], Awaitable[RebuiltGroup]]:
        async def load() -> RebuiltGroup:
            self.names.append(name)
            return self.group

        return load


async def test_groups_read_to_their_end_go_before_the_least_recently_used() -> None:
    loads = Loads()
    cache = RebuiltGroups(capacity_bytes=2 * len(loads.group.data))
    for name in ("a", "b"):
        await cache.get((name, 0), loads.of(name))
    cache.read_to_end(("b", 0))
    await cache.get(("c", 0), loads.of("c"))  # b goes, though a was used before it
    await cache.get(("a", 0), loads.of("a"))
    await cache.get(("b", 0), loads.of("b"))
    assert loads.names == ["a", "b", "c", "b"]


async def test_a_group_read_to_its_end_and_asked_for_again_is_in_use_again() -> None:
    loads = Loads()
    cache = RebuiltGroups(capacity_bytes=2 * len(loads.group.data))
    for name in ("a", "b"):
        await cache.get((name, 0), loads.of(name))
        cache.read_to_end((name, 0))
    await cache.get(("a", 0), loads.of("a"))  # another consumer reads a
    await cache.get(("c", 0), loads.of("c"))  # b goes: it is the only one read to its end
    assert cache.holds(("a", 0))
    assert not cache.holds(("b", 0))
    assert loads.names == ["a", "b", "c"]


async def test_reading_ahead_needs_room_beside_the_groups_in_use() -> None:
    loads = Loads()
    cache = RebuiltGroups(capacity_bytes=5 * len(loads.group.data))  # two kept for fetches
    assert DEMAND_LOADS == 2
    assert cache.has_room_ahead(1)
    for name in ("a", "b"):
        await cache.get((name, 0), loads.of(name))
    assert cache.has_room_ahead(1)
    assert not cache.has_room_ahead(2)  # one being read ahead already, and one more
    cache.read_to_end(("a", 0))
    assert cache.has_room_ahead(2)  # a may go for them


async def test_a_group_larger_than_the_cache_is_returned_and_not_kept() -> None:
    group = group_of(5)
    cache = RebuiltGroups(capacity_bytes=len(group.data) - 1)

    async def load() -> RebuiltGroup:
        return group

    assert await cache.get(("a", 0), load) is group
    assert cache.size == 0


async def test_concurrent_fetches_of_a_group_share_one_load() -> None:
    cache = RebuiltGroups(1 << 20)
    release = asyncio.Event()
    loads = 0

    async def load() -> RebuiltGroup:
        nonlocal loads
        loads += 1
        await release.wait()
        return group_of(2)

    waiting = [asyncio.create_task(cache.get(("f", 1), load)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiting)
    assert loads == 1
    assert all(r is results[0] for r in results)


async def test_a_failed_load_fails_its_waiters_and_the_next_fetch_loads_again() -> None:
    cache = RebuiltGroups(1 << 20)
    release = asyncio.Event()

    async def broken() -> RebuiltGroup:
        await release.wait()
        raise OSError("gone")

    first = asyncio.create_task(cache.get(("f", 0), broken))
    second = asyncio.create_task(cache.get(("f", 0), broken))
    await asyncio.sleep(0)
    release.set()
    for task in (first, second):
        with pytest.raises(OSError, match="gone"):
            await task

    async def working() -> RebuiltGroup:
        return group_of(1)

    assert (await cache.get(("f", 0), working)).batch_count == 1


async def test_a_cancelled_loader_does_not_cancel_the_fetches_waiting_for_it() -> None:
    cache = RebuiltGroups(1 << 20)
    hang = asyncio.Event()

    async def stuck() -> RebuiltGroup:
        await hang.wait()
        raise AssertionError("never released")

    async def working() -> RebuiltGroup:
        return group_of(3)

    loader = asyncio.create_task(cache.get(("f", 0), stuck))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.get(("f", 0), working))
    await asyncio.sleep(0)
    loader.cancel()
    assert (await waiter).batch_count == 1
    with pytest.raises(asyncio.CancelledError):
        await loader


async def test_groups_loaded_together_are_one_load_that_fetches_of_any_of_them_wait_for() -> None:
    cache = RebuiltGroups(1 << 20)
    release = asyncio.Event()
    loads = 0
    groups = [group_of(1), group_of(2), group_of(3)]

    async def load_three() -> list[RebuiltGroup]:
        nonlocal loads
        loads += 1
        await release.wait()
        return groups

    async def never() -> RebuiltGroup:
        raise AssertionError("loaded on its own")

    keys = [("f", 4), ("f", 5), ("f", 6)]
    together = cache.load_together(keys, load_three, name="three")
    assert all(cache.holds(key) for key in keys)  # from the call on, before the task runs
    wanted = asyncio.create_task(cache.get(("f", 5), never))
    await asyncio.sleep(0)
    release.set()
    await together

    assert await wanted is groups[1]
    assert [await cache.get(key, never) for key in keys] == groups
    assert loads == 1
    assert cache.size == sum(len(g.data) for g in groups)


@pytest.mark.parametrize("returned", [OSError("gone"), 2], ids=["failed", "too-few-groups"])
async def test_a_failed_load_together_keeps_nothing_and_its_waiters_load_their_own(
    returned: OSError | int,
) -> None:
    cache = RebuiltGroups(1 << 20)
    release = asyncio.Event()

    async def load() -> list[RebuiltGroup]:
        await release.wait()
        if isinstance(returned, OSError):
            raise returned
        return [group_of(1)] * returned

    async def load_one() -> RebuiltGroup:
        return group_of(4)

    keys = [("f", 0), ("f", 1), ("f", 2)]
    together = cache.load_together(keys, load, name="three")
    waiter = asyncio.create_task(cache.get(("f", 1), load_one))
    await asyncio.sleep(0)
    release.set()
    with pytest.raises((OSError, ValueError)):
        await together

    assert (await waiter).batch_count == 1  # its own load: a fault elsewhere is not its own
    assert [cache.holds(key) for key in keys] == [False, True, False]


async def test_a_load_together_cancelled_before_it_runs_leaves_its_groups_to_fetches() -> None:
    cache = RebuiltGroups(1 << 20)

    async def never() -> list[RebuiltGroup]:
        raise AssertionError("started")

    async def load_one() -> RebuiltGroup:
        return group_of(2)

    keys = [("f", 0), ("f", 1)]
    together = cache.load_together(keys, never, name="two")
    waiter = asyncio.create_task(cache.get(("f", 0), load_one))
    together.cancel()

    assert (await waiter).batch_count == 1
    assert together.cancelled()
    assert [cache.holds(key) for key in keys] == [True, False]
