"""Turns per partition: request order where requests share a partition, no wait elsewhere."""

from __future__ import annotations

import asyncio

from icefloe.broker.submit_order import SubmitOrder, Turn


async def take(turn: Turn, name: str, log: list[str], gate: asyncio.Event | None = None) -> None:
    async with turn:
        log.append(name)
        if gate is not None:
            await gate.wait()


async def test_a_request_waits_only_for_earlier_requests_on_the_same_partition() -> None:
    order = SubmitOrder()
    first = order.take_turns(["p", "q"])
    second = order.take_turns(["p"])
    third = order.take_turns(["q"])
    log: list[str] = []
    gate = asyncio.Event()

    holding = asyncio.create_task(take(first["p"], "first on p", log, gate))
    waiting = asyncio.create_task(take(second["p"], "second on p", log))
    first["q"].end()  # the first request failed before it used its turn on q
    elsewhere = asyncio.create_task(take(third["q"], "third on q", log))
    await asyncio.wait_for(elsewhere, 5)
    assert log == ["first on p", "third on q"]  # the second waits for the first's turn on p

    gate.set()
    await asyncio.wait_for(asyncio.gather(holding, waiting), 5)
    assert log == ["first on p", "third on q", "second on p"]
    assert not order._last  # nothing kept once every turn is over


async def test_a_request_cancelled_before_its_turn_does_not_hold_up_the_next() -> None:
    order = SubmitOrder()
    first, second, third = (order.take_turns(["p"]) for _ in range(3))
    log: list[str] = []
    gate = asyncio.Event()
    holding = asyncio.create_task(take(first["p"], "first", log, gate))
    cancelled = asyncio.create_task(take(second["p"], "second", log))
    last = asyncio.create_task(take(third["p"], "third", log))
    await asyncio.sleep(0)

    cancelled.cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert cancelled.cancelled()
    assert log == ["first"]  # the third still waits for the first, not for the cancelled one

    gate.set()
    await asyncio.wait_for(asyncio.gather(holding, last), 5)
    assert log == ["first", "third"]
    assert not order._last
