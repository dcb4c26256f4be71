"""A broker takes clients only once it knows the cluster: a request answered earlier would name
no broker as a partition's leader or a group's coordinator (its handler failed, and the
connection closed with a traceback in the log)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.request import FindCoordinatorRequest

from icefloe.broker.broker import Broker
from icefloe.config import load_config
from tests.support.kafka_wire import KafkaWire
from tests.support.servers import free_port


def find_coordinator(port: int) -> Any:
    with KafkaWire(f"127.0.0.1:{port}", timeout=10) as wire:
        return wire.request(FindCoordinatorRequest(coordinator_keys=("readers",))).coordinators[0]


async def test_a_client_is_taken_only_once_the_broker_has_joined_the_cluster(
    tmp_path: Path,
) -> None:
    config = load_config(
        env={}, overrides={"data_dir": str(tmp_path), "compactor": {"enabled": False}}
    )
    broker = await Broker.open(config)
    joining, join = asyncio.Event(), broker.cluster.join
    joined = asyncio.Event()

    async def slow_join(*args: Any, **kwargs: Any) -> Any:
        joining.set()
        await joined.wait()
        return await join(*args, **kwargs)

    broker.cluster.join = slow_join  # type: ignore[method-assign]
    port = free_port()
    starting = asyncio.create_task(broker.start(port=port))
    try:
        await asyncio.wait_for(joining.wait(), 30)  # bound, and joining
        refused = 0
        for _ in range(5):  # refused, not taken and then dropped
            try:
                await asyncio.to_thread(find_coordinator, port)
            except ConnectionRefusedError:
                refused += 1
            await asyncio.sleep(0.05)
        joined.set()
        await starting
        coordinator = await asyncio.to_thread(find_coordinator, port)
    finally:
        joined.set()
        if not starting.done():
            starting.cancel()
        await broker.stop()

    assert refused == 5
    assert coordinator.error_code == ErrorCode.none
    assert coordinator.node_id == broker.me.node_id
