"""Produce requests wait only for the earlier requests that write the same partition: the
store round trips of different partitions (an idempotent producer claiming its lease on each)
overlap, whether the partitions come in one request (the Java client) or in one request each
(librdkafka)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from icefloe.broker.broker import Broker
from icefloe.config import load_config
from icefloe.ports.metadata import Record
from icefloe.storage import keys
from tests.support.kafka_wire import KafkaWire, batch_of, produce_request_for

TOPIC = "turns"
PARTITIONS = 4
ALL_HERE_WITHIN_S = 5.0
"""How long a held claim waits for the others; a claim that waits in vain took its turn alone."""


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = load_config(
        env={}, overrides={"data_dir": str(tmp_path), "compactor": {"enabled": False}}
    )
    broker = await Broker.open(config)
    await broker.start(port=0)
    await broker.topics.create(TOPIC, PARTITIONS)
    yield broker
    await broker.stop()


class HeldClaims:
    """Holds each producer-lease write until all partitions' writes are on their way (or
    :data:`ALL_HERE_WITHIN_S` passes), and counts how many were on their way at once."""

    def __init__(self, broker: Broker) -> None:
        self.most_at_once = 0
        self._on_their_way = 0
        self._all_here = asyncio.Event()
        self._real_put: Callable[..., Any] = broker.storage.metadata.put
        topic = broker.topics.get_cached(TOPIC)
        assert topic is not None
        self._prefixes = tuple(keys.producers_prefix(stream) for stream in topic.streams)
        broker.storage.metadata.put = self._put  # type: ignore[method-assign]

    async def _put(self, key: str, *args: Any, **kwargs: Any) -> Record:
        if key.startswith(self._prefixes):
            self._on_their_way += 1
            self.most_at_once = max(self.most_at_once, self._on_their_way)
            if self._on_their_way == PARTITIONS:
                self._all_here.set()
            try:
                await asyncio.wait_for(self._all_here.wait(), ALL_HERE_WITHIN_S)
            except TimeoutError:
                pass
            finally:
                self._on_their_way -= 1
        result: Record = await self._real_put(key, *args, **kwargs)
        return result


def produce(partitions: range, producer_id: int) -> Any:
    """A Produce request with an idempotent producer's first batch for each partition."""
    first = batch_of([b"v"], producer_id=producer_id, producer_epoch=0, base_sequence=0)
    return produce_request_for(TOPIC, dict.fromkeys(partitions, first))


def errors(response: Any) -> list[int]:
    return [p.error_code for t in response.responses for p in t.partition_responses]


async def test_the_partitions_of_one_request_claim_their_leases_together(broker: Broker) -> None:
    producer_id = await broker.storage.allocate_producer_id()
    claims = HeldClaims(broker)

    def send() -> Any:
        with KafkaWire(f"{broker.me.host}:{broker.me.port}") as wire:
            return wire.request(produce(range(PARTITIONS), producer_id))

    response = await asyncio.to_thread(send)

    assert errors(response) == [0] * PARTITIONS
    assert claims.most_at_once == PARTITIONS


async def test_pipelined_requests_for_different_partitions_claim_their_leases_together(
    broker: Broker,
) -> None:
    producer_id = await broker.storage.allocate_producer_id()
    claims = HeldClaims(broker)

    def send() -> list[Any]:
        requests = [produce(range(p, p + 1), producer_id) for p in range(PARTITIONS)]
        with KafkaWire(f"{broker.me.host}:{broker.me.port}") as wire:
            for request in requests:
                wire.send(request)
            return [wire.receive(request) for request in requests]

    responses = await asyncio.to_thread(send)

    assert [errors(r) for r in responses] == [[0]] * PARTITIONS
    assert claims.most_at_once == PARTITIONS
