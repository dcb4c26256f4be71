"""The broker's memory budget: takers wait while it is spent, a lone request larger than it
still passes, every byte held is given back exactly once, and the budget must leave room for
client data once the caches have their share."""

from __future__ import annotations

import asyncio

import pytest

from icefloe.broker.memory import ByteBudget, Held, client_data_bytes
from icefloe.config.broker import BrokerOptions
from icefloe.config.storage import StorageOptions
from icefloe.errors import ConfigError


async def test_a_taker_waits_until_enough_is_given_back() -> None:
    budget = ByteBudget(100)
    await budget.take(80)
    waiting = asyncio.create_task(budget.take(30))
    await asyncio.sleep(0.01)
    assert not waiting.done()

    budget.give_back(50)
    await asyncio.wait_for(waiting, 1)
    assert budget.used == 60


async def test_a_lone_request_larger_than_the_budget_passes() -> None:
    budget = ByteBudget(100)
    await asyncio.wait_for(budget.take(500), 1)
    assert budget.used == 500
    assert budget.free == 0


def held_pair(
    connection_limit: int = 1000, broker_limit: int = 1000
) -> tuple[Held, ByteBudget, ByteBudget, set[Held]]:
    connection, broker, holds = ByteBudget(connection_limit), ByteBudget(broker_limit), set()
    return Held(connection, broker, holds), connection, broker, holds


async def test_held_bytes_are_counted_in_both_budgets_and_released_once() -> None:
    held, connection, broker, holds = held_pair()
    await held.take(100)
    held.add_response(40)  # a response built without taking ahead
    assert (connection.used, broker.used) == (140, 140)

    held.release()
    held.release()
    assert (connection.used, broker.used) == (0, 0)
    assert holds == set()


async def test_a_grant_gives_back_what_the_read_left_and_holds_what_it_overran() -> None:
    held, _, broker, _ = held_pair()
    granted = await held.take_up_to(300, least=10, wait_s=0)
    assert granted == 300
    held.settle(granted, used=120)
    assert broker.used == 120
    again = await held.take_up_to(100, least=10, wait_s=0)
    held.settle(again, used=250)  # a whole first batch larger than the grant
    assert broker.used == 370
    held.add_response(370 + 20)  # the frame adds its headers only
    assert broker.used == 390


async def test_a_grant_is_what_is_free_in_the_tighter_budget() -> None:
    held, _, _, _ = held_pair(connection_limit=1000, broker_limit=200)
    assert await held.take_up_to(500, least=10, wait_s=0) == 200
    assert await held.take_up_to(500, least=10, wait_s=0.01) == 0


async def test_bytes_taken_after_the_connection_closed_are_given_straight_back() -> None:
    held, connection, broker, _ = held_pair()
    held.release()
    await held.take(100)
    held.add_response(50)
    assert await held.take_up_to(10, least=1, wait_s=0) == 0
    assert (connection.used, broker.used) == (0, 0)


def test_the_budget_must_leave_room_for_client_data_after_the_caches() -> None:
    storage = StorageOptions(wal_cache_bytes=200 << 20)
    with pytest.raises(
        ConfigError, match=r"max_memory_bytes \(256 MiB\) leaves .*wal_cache_bytes 200 MiB"
    ):
        client_data_bytes(BrokerOptions(max_memory_bytes=256 << 20), storage)


def test_the_default_budget_leaves_most_of_it_to_client_data() -> None:
    left = client_data_bytes(BrokerOptions(), StorageOptions())
    assert 256 << 20 < left < BrokerOptions().max_memory_bytes
