"""KeyedLocks: one FIFO lock per key, forgotten once nobody holds or waits for it."""

from __future__ import annotations

import asyncio

import pytest

from icefloe.storage.locks import KeyedLocks


async def test_holders_of_one_key_go_one_at_a_time_in_arrival_order() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def hold(name: str) -> None:
        async with locks.hold("k"):
            order.append(f"{name} in")
            await asyncio.sleep(0)
            order.append(f"{name} out")

    await asyncio.gather(hold("a"), hold("b"), hold("c"))
    assert order == ["a in", "a out", "b in", "b out", "c in", "c out"]
    assert len(locks) == 0


async def test_different_keys_do_not_wait_for_each_other() -> None:
    locks = KeyedLocks()
    async with locks.hold("a"):
        await asyncio.wait_for(_enter_and_leave(locks, "b"), timeout=1)
        assert len(locks) == 1
    assert len(locks) == 0


async def test_a_block_that_raises_releases_the_key() -> None:
    locks = KeyedLocks()
    with pytest.raises(RuntimeError):
        async with locks.hold("k"):
            raise RuntimeError("boom")
    assert len(locks) == 0
    await asyncio.wait_for(_enter_and_leave(locks, "k"), timeout=1)


async def test_a_waiter_cancelled_before_its_turn_leaves_no_trace() -> None:
    locks = KeyedLocks()
    async with locks.hold("k"):
        waiter = asyncio.create_task(_enter_and_leave(locks, "k"))
        await asyncio.sleep(0)  # the waiter is queued behind the holder
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert len(locks) == 1  # the holder's
    assert len(locks) == 0
    await asyncio.wait_for(_enter_and_leave(locks, "k"), timeout=1)


async def _enter_and_leave(locks: KeyedLocks, key: str) -> None:
    async with locks.hold(key):
        pass
