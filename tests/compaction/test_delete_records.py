"""DeleteRecords in storage: the log start moves forward, records before it are unreadable even
inside an index entry or a compacted file, and retention then removes the entries wholly before
it (never the last one)."""

from __future__ import annotations

import asyncio
import time

import pytest

from icefloe.compaction import retention
from icefloe.storage import keys
from icefloe.storage.engine import StreamStorage
from icefloe.storage.reader import OffsetOutOfRange
from icefloe.storage.records import Record
from tests.compaction.conftest import Parts


def records(n: int, timestamp: int) -> list[Record]:
    return [Record(i, timestamp + i, None, b"v%d" % i) for i in range(n)]


async def three_entries(storage: StreamStorage, stream: int, now: int) -> None:
    """Offsets 0-4, 5-9 and 10-14, one index entry each, timestamps now + offset."""
    for first in (0, 5, 10):
        await storage.append(
            stream, [r._replace(timestamp=now + first + r.offset) for r in records(5, 0)]
        )


async def test_the_log_start_moves_into_an_entry_and_reads_before_it_are_out_of_range(
    parts: Parts,
) -> None:
    storage, topics, _ = parts
    stream = (await topics.create("t", 1, {})).streams[0]
    now = int(time.time() * 1000)
    await three_entries(storage, stream, now)

    assert await storage.delete_records(stream, 7) == 7
    assert await storage.log_start(stream) == 7
    assert await storage.log_end(stream) == 15
    for offset in (0, 5, 6):
        with pytest.raises(OffsetOutOfRange):
            await storage.read(stream, offset)
    assert [r.offset for r in await storage.read_records(stream, 7)] == list(range(7, 15))
    # A timestamp before the log start finds the first record at or after it.
    assert await storage.offset_for_timestamp(stream, now) == 7


async def test_minus_one_is_the_log_end_and_past_it_or_negative_is_out_of_range(
    parts: Parts,
) -> None:
    storage, topics, _ = parts
    stream = (await topics.create("t", 1, {})).streams[0]
    await three_entries(storage, stream, int(time.time() * 1000))
    for bad in (16, -2, -(1 << 63)):
        with pytest.raises(OffsetOutOfRange):
            await storage.delete_records(stream, bad)
    assert await storage.log_start(stream) == 0
    assert await storage.delete_records(stream, -1) == 15
    assert await storage.read_records(stream, 15) == []
    with pytest.raises(OffsetOutOfRange):
        await storage.read(stream, 14)


async def test_the_log_start_never_goes_back_and_repeating_a_deletion_changes_nothing(
    parts: Parts,
) -> None:
    storage, topics, _ = parts
    stream = (await topics.create("t", 1, {})).streams[0]
    await three_entries(storage, stream, int(time.time() * 1000))
    assert await storage.delete_records(stream, 9) == 9
    assert await storage.delete_records(stream, 9) == 9
    assert await storage.delete_records(stream, 3) == 9
    record = await storage.metadata.get(keys.log_start(stream))
    assert record is not None
    assert record.value == b"9"


async def test_another_engine_refuses_the_deleted_records(parts: Parts) -> None:
    storage, topics, _ = parts
    stream = (await topics.create("t", 1, {})).streams[0]
    await three_entries(storage, stream, int(time.time() * 1000))
    other = StreamStorage(storage.metadata, storage.object_store, storage.wal, storage.options)
    await other.start()
    try:
        assert [r.offset for r in await other.read_records(stream, 0)][:1] == [0]  # cached
        await storage.delete_records(stream, 4)
        assert await other.log_start(stream) == 4  # read from the store
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the notification reaches the other engine
            try:
                await other.read(stream, 0)
            except OffsetOutOfRange:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the other engine still reads offset 0")
    finally:
        await other.index.close()


async def test_retention_removes_the_entries_wholly_before_the_log_start_but_not_the_last(
    parts: Parts,
) -> None:
    storage, topics, _ = parts
    topic = await topics.create("t", 1, {})  # Kafka's default retention: nothing is old yet
    stream = topic.streams[0]
    now = int(time.time() * 1000)
    await three_entries(storage, stream, now)
    await storage.delete_records(stream, 7)
    assert await retention.enforce(storage, topic, now) == 1  # 0-4; 5-9 holds 7, 8, 9
    assert [(e.start, e.end) for e in await storage.index.scan(stream)] == [(5, 10), (10, 15)]
    assert await storage.log_start(stream) == 7
    assert await retention.enforce(storage, topic, now) == 0  # idempotent

    await storage.delete_records(stream, -1)
    assert await retention.enforce(storage, topic, now) == 1
    assert [(e.start, e.end) for e in await storage.index.scan(stream)] == [(10, 15)]
    assert await storage.log_start(stream) == 15
    assert await storage.log_end(stream) == 15


async def test_a_compacted_file_honours_the_log_start_inside_it(parts: Parts) -> None:
    storage, topics, compactor = parts
    topic = await topics.create("t", 1, {})
    stream = topic.streams[0]
    now = int(time.time() * 1000)
    await three_entries(storage, stream, now)
    assert await compactor.until_idle() >= 1
    assert all(not e.in_wal for e in await storage.index.scan(stream))
    await storage.delete_records(stream, 6)
    with pytest.raises(OffsetOutOfRange):
        await storage.read(stream, 5)
    assert [r.offset for r in await storage.read_records(stream, 6)] == list(range(6, 15))
    assert await storage.offset_for_timestamp(stream, now) == 6


async def test_deleting_the_stream_removes_its_log_start(parts: Parts) -> None:
    storage, topics, _ = parts
    stream = (await topics.create("t", 1, {})).streams[0]
    await three_entries(storage, stream, int(time.time() * 1000))
    await storage.delete_records(stream, 3)
    await storage.delete_stream(stream)
    assert await storage.metadata.get(keys.log_start(stream)) is None
