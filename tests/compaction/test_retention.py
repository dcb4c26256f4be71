"""retention.ms and retention.bytes remove whole entries from the front, never the last."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from icefloe.compaction import retention
from icefloe.storage import index_reader
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import IndexEntry
from icefloe.storage.reader import OffsetOutOfRange
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.support.storage import storage_config


@pytest.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[StreamStorage, TopicRegistry]]:
    async with await StreamStorage.open(storage_config(tmp_path)) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        yield storage, topics
        await topics.close()


def records(n: int, timestamp: int) -> list[Record]:
    return [Record(i, timestamp, None, b"x" * 100) for i in range(n)]


async def test_entries_older_than_retention_ms_go(
    setup: tuple[StreamStorage, TopicRegistry],
) -> None:
    storage, topics = setup
    now = int(time.time() * 1000)
    topic = await topics.create("t", 1, {"retention.ms": "60000"})
    stream = topic.streams[0]
    await storage.append(stream, records(5, now - 120_000))
    await storage.append(stream, records(5, now - 90_000))
    await storage.append(stream, records(5, now + 120_000))  # stamped in the future
    await storage.append(stream, records(5, now))
    a_minute_later = now + 61_000
    assert await retention.enforce(storage, topic, a_minute_later) == 2
    assert await storage.log_start(stream) == 10
    assert await storage.log_end(stream) == 20
    with pytest.raises(OffsetOutOfRange):
        await storage.read(stream, 3)
    assert [r.offset for r in await storage.read_records(stream, 10)] == list(range(10, 20))


async def test_records_with_old_timestamps_stay_for_retention_ms_after_they_were_written(
    setup: tuple[StreamStorage, TopicRegistry],
) -> None:
    storage, topics = setup
    now = int(time.time() * 1000)
    topic = await topics.create("t", 1, {"retention.ms": "60000"})
    await storage.append(topic.streams[0], records(5, now - 365 * 24 * 3600 * 1000))
    await storage.append(topic.streams[0], records(5, now))
    assert await retention.enforce(storage, topic, now) == 0
    assert await retention.enforce(storage, topic, now + 61_000) == 1


async def test_the_last_entry_stays_so_the_log_end_never_goes_back(
    setup: tuple[StreamStorage, TopicRegistry],
) -> None:
    storage, topics = setup
    now = int(time.time() * 1000)
    topic = await topics.create("t", 1, {"retention.ms": "1000"})
    stream = topic.streams[0]
    await storage.append(stream, records(5, now - 60_000))
    await storage.append(stream, records(5, now - 60_000))
    assert await retention.enforce(storage, topic, now + 60_000) == 1
    assert await storage.append(stream, records(1, now)) == 10


async def test_retention_bytes_keeps_at_least_that_much(
    setup: tuple[StreamStorage, TopicRegistry],
) -> None:
    storage, topics = setup
    now = int(time.time() * 1000)
    topic = await topics.create("t", 1)
    stream = topic.streams[0]
    for _ in range(4):
        await storage.append(stream, records(10, now))
    one_entry = (await storage.index.scan(stream))[0].size
    sized = await topics.set_configs("t", {"retention.bytes": str(2 * one_entry)})
    assert await retention.enforce(storage, sized, now) == 2
    assert await storage.log_start(stream) == 20


async def test_kafkas_seven_day_default_applies(
    setup: tuple[StreamStorage, TopicRegistry],
) -> None:
    storage, topics = setup
    now = int(time.time() * 1000)
    topic = await topics.create("t", 1)
    week = 7 * 24 * 3600 * 1000
    await storage.append(topic.streams[0], records(5, now))
    await storage.append(topic.streams[0], records(5, now + week))  # stamped a week ahead
    await storage.append(topic.streams[0], records(5, now))
    assert await retention.enforce(storage, topic, now + week - 1000) == 0
    assert await retention.enforce(storage, topic, now + week + 1000) == 1


async def test_a_compact_only_topic_keeps_everything(
    setup: tuple[StreamStorage, TopicRegistry],
) -> None:
    storage, topics = setup
    topic = await topics.create("t", 1, {"cleanup.policy": "compact", "retention.ms": "1"})
    await storage.append(topic.streams[0], records(5, 0))
    await storage.append(topic.streams[0], records(5, 0))
    assert await retention.enforce(storage, topic, 10**13) == 0


async def test_retention_by_time_reads_the_index_only_as_far_as_entries_expire(
    setup: tuple[StreamStorage, TopicRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, topics = setup
    now = int(time.time() * 1000)
    topic = await topics.create("t", 1, {"retention.ms": "60000"})
    stream = topic.streams[0]
    await storage.append(stream, records(5, now - 120_000))
    for _ in range(20):
        await storage.append(stream, records(5, now + 120_000))
    decoded = count_decoded_entries(monkeypatch)

    expired = await retention.expired_entries(storage, topic, stream, now + 61_000)

    assert [(e.start, e.end) for e in expired] == [(0, 5)]
    assert decoded == [2]  # the expired entry and the first one kept


async def test_a_topic_that_cannot_expire_reads_no_index_entry(
    setup: tuple[StreamStorage, TopicRegistry], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, topics = setup
    topic = await topics.create("t", 1, {"cleanup.policy": "compact"})
    for _ in range(3):
        await storage.append(topic.streams[0], records(5, 0))
    decoded = count_decoded_entries(monkeypatch)

    assert await retention.enforce(storage, topic, 10**13) == 0
    assert decoded == [0]


def count_decoded_entries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-item list counting the index entries decoded from the store from now on."""
    decoded = [0]
    decode = index_reader.index.decode

    def counted(key: bytes, value: bytes) -> IndexEntry:
        decoded[0] += 1
        return decode(key, value)

    monkeypatch.setattr(index_reader.index, "decode", counted)
    return decoded
