"""What taking turns per partition costs a produce request, against one lock per connection.

A request of 8 partitions whose submits do not wait (the lease of each is held): the turns,
and the worker tasks that submit the partitions together, against the lock the produce
handler used to take around all its partitions. Run with
``.venv/bin/pytest tests/bench/test_bench_submit_order.py --benchmark-enable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.broker.submit_order import SubmitOrder

PARTITIONS = [("bench", p) for p in range(8)]
REQUESTS = 100
"""Requests per measured round, run on one event loop."""


async def submit(partition: tuple[str, int], done: list[tuple[str, int]]) -> None:
    """A submit that does not wait, as with the producer's lease in memory."""
    done.append(partition)


async def one_request_in_turns(order: SubmitOrder, done: list[tuple[str, int]]) -> None:
    """What the produce handler does around its submits (``handlers/produce.py``)."""
    turns = order.take_turns(PARTITIONS)
    waiting = iter(PARTITIONS)

    async def submit_the_next() -> None:
        for partition in waiting:
            async with turns[partition]:
                await submit(partition, done)

    try:
        await asyncio.gather(*(submit_the_next() for _ in PARTITIONS))
    finally:
        for turn in turns.values():
            turn.end()


async def requests_in_turns(order: SubmitOrder, done: list[tuple[str, int]]) -> None:
    for _ in range(REQUESTS):
        await one_request_in_turns(order, done)


async def requests_under_one_lock(lock: asyncio.Lock, done: list[tuple[str, int]]) -> None:
    for _ in range(REQUESTS):
        async with lock:
            for partition in PARTITIONS:
                await submit(partition, done)


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def test_turns_per_partition(benchmark: BenchmarkFixture, loop: asyncio.AbstractEventLoop) -> None:
    order = SubmitOrder()
    done: list[tuple[str, int]] = []
    benchmark(lambda: loop.run_until_complete(requests_in_turns(order, done)))
    assert done[: len(PARTITIONS)] == PARTITIONS
    assert not order._last


def test_one_lock_per_connection(
    benchmark: BenchmarkFixture, loop: asyncio.AbstractEventLoop
) -> None:
    done: list[tuple[str, int]] = []
    benchmark(lambda: loop.run_until_complete(requests_under_one_lock(asyncio.Lock(), done)))
    assert done[: len(PARTITIONS)] == PARTITIONS
