"""Topics for end-to-end tests, and the stored state tests check behind a running broker.

Topics are created in the metadata store of the running `icefloe serve`, through the same
:class:`TopicRegistry` its brokers use (they find a topic they have not cached yet in the
store). Once the CreateTopics handler is dependable, :func:`create_topic` can go through a
Kafka admin client instead; its callers need not change.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from icefloe.config import load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.support.broker import RunningIcefloe

T = TypeVar("T")


def own_topic_name(request: pytest.FixtureRequest, prefix: str = "") -> str:
    """A legal topic name that is this test's own (its node name, parameters included), so
    tests sharing one cluster never share a topic."""
    return re.sub(r"[^a-zA-Z0-9._-]", "-", f"{prefix}{request.node.name}")[:200]


def create_topic(icefloe: RunningIcefloe, name: str, partitions: int = 1) -> None:
    """Create ``name`` with ``partitions`` partitions in the running cluster's store."""

    async def create(topics: TopicRegistry, storage: StreamStorage) -> None:
        await topics.create(name, partitions)

    _with_registry(icefloe.data_dir, create)


def log_end(icefloe: RunningIcefloe, topic: str, partition: int) -> int:
    """The committed log end offset of a partition, read from the store, not via a broker."""

    async def read(topics: TopicRegistry, storage: StreamStorage) -> int:
        return await storage.log_end(await _stream(topics, topic, partition))

    return _with_registry(icefloe.data_dir, read)


def stored_records(icefloe: RunningIcefloe, topic: str, partition: int) -> list[Record]:
    """Every record of a partition, decoded from storage (a back door past the brokers)."""

    async def read(topics: TopicRegistry, storage: StreamStorage) -> list[Record]:
        stream = await _stream(topics, topic, partition)
        out: list[Record] = []
        offset, end = await storage.log_start(stream), await storage.log_end(stream)
        while offset < end:
            out.extend(await storage.read_records(stream, offset))
            offset = out[-1].offset + 1
        return out

    return _with_registry(icefloe.data_dir, read)


async def _stream(topics: TopicRegistry, name: str, partition: int) -> int:
    topic = await topics.get(name)
    assert topic is not None, f"no topic {name!r}"
    return topic.streams[partition]


def with_storage(
    icefloe: RunningIcefloe, work: Callable[[TopicRegistry, StreamStorage], Awaitable[T]]
) -> T:
    """Run ``work`` on the running cluster's topics and storage (opened beside the brokers)."""
    return _with_registry(icefloe.data_dir, work)


def _with_registry(
    data_dir: Path, work: Callable[[TopicRegistry, StreamStorage], Awaitable[T]]
) -> T:
    async def run() -> T:
        config = load_config(env={}, overrides={"data_dir": str(data_dir)})
        async with await StreamStorage.open(config) as storage:
            return await work(TopicRegistry(storage), storage)

    return asyncio.run(run())
