"""Per-broker caches filled from the store on a miss: a store answer that arrives after the
broker has heard of a deletion must not bring the deleted key back into the cache, since no
later notification would take it away again."""

from __future__ import annotations

import asyncio

import pytest

from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record, build_batch
from icefloe.storage.transactions import OpenMark
from icefloe.topics.registry import TopicRegistry
from tests.support.waiting import eventually


def delay_first_answer(
    storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[object], asyncio.Event]:
    """Make the next ``get`` on ``storage``'s metadata read at once but answer only when the
    returned event is set; every answer is recorded in the returned list."""
    answers: list[object] = []
    release = asyncio.Event()
    store_get = storage.metadata.get

    async def late_get(key: str) -> object:
        record = await store_get(key)
        answers.append(record)
        if len(answers) == 1:
            await release.wait()
        return record

    monkeypatch.setattr(storage.metadata, "get", late_get)
    return answers, release


async def test_a_topic_read_as_it_is_deleted_is_not_cached_past_its_deletion(
    storage: StreamStorage, other_storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, other = TopicRegistry(storage), TopicRegistry(other_storage)
    await broker.start()
    await other.start()
    try:
        await other.create("orders", 1)
        await eventually(lambda: broker.get_cached("orders") is not None)
        answers, release = delay_first_answer(storage, monkeypatch)
        broker._forget("orders")  # as if this broker had not heard of the topic yet
        lookup = asyncio.create_task(broker.get("orders"))
        await eventually(lambda: len(answers) == 1)
        await other.delete("orders")
        await eventually(lambda: answers[-1] is None)  # this broker hears of the deletion
        release.set()
        assert await lookup is not None  # the answer of its moment
        assert broker.get_cached("orders") is None
    finally:
        await broker.close()
        await other.close()


async def test_a_mark_read_as_its_transaction_ends_is_not_cached_past_the_end(
    storage: StreamStorage, other_storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker checks the store for an open-transaction mark its cache lacks (a produce, a
    fetch). A mark brought back after its transaction ended would hold read_committed
    consumers at the ended transaction for good."""
    topic = await TopicRegistry(storage).create("orders", 1)
    stream = topic.streams[0]
    marks, coordinator_side = storage.transactions, other_storage.transactions
    await coordinator_side.mark_open(stream, OpenMark(7, 0, 0, "tx"))
    await eventually(lambda: marks.stable_offset(stream, 5) == 0)
    answers, release = delay_first_answer(storage, monkeypatch)
    marks._forget(stream, 7)  # as if this broker had not heard of the mark yet
    lookup = asyncio.create_task(marks.open_mark(stream, 7))
    await eventually(lambda: len(answers) == 1)
    await coordinator_side.clear_open(stream, 7)  # the transaction ends
    await eventually(lambda: answers[-1] is None)  # this broker hears of it
    release.set()
    assert await lookup is not None  # the answer of its moment
    assert marks.stable_offset(stream, 5) == 5


async def test_a_log_start_read_as_records_are_deleted_is_not_kept_past_the_deletion(
    storage: StreamStorage, other_storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads refuse offsets below the log start this broker last read; a read of it that
    another broker's DeleteRecords overtook must not stay as the floor."""
    topic = await TopicRegistry(storage).create("orders", 1)
    stream = topic.streams[0]
    for n in range(4):
        await storage.append_batches(stream, build_batch([Record(0, n, None, b"v")]))
    index = storage.index
    answers, release = delay_first_answer(storage, monkeypatch)
    lookup = asyncio.create_task(index.log_start_floor(stream))
    await eventually(lambda: len(answers) == 1)
    await other_storage.delete_records(stream, 2)
    await asyncio.sleep(0.2)  # time for this broker to hear of it
    release.set()
    assert await lookup == 0  # the answer of its moment
    assert await index.log_start_floor(stream) == 2


async def test_index_entries_read_ahead_as_others_are_removed_are_not_cached(
    storage: StreamStorage, other_storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache miss reads the entries after the one wanted too; if entries are removed while
    that read is under way (retention, a compaction swap), their notifications are already
    past, so what the read found is used but not kept."""
    topic = await TopicRegistry(storage).create("orders", 1)
    stream = topic.streams[0]
    for n in range(4):
        await storage.append_batches(stream, build_batch([Record(0, n, None, b"v")]))
    index = other_storage.index
    answers: list[object] = []
    release = asyncio.Event()
    store_scan = other_storage.metadata.scan

    async def late_scan(start: str, end: str, *, limit: int | None = None) -> object:
        records = await store_scan(start, end, limit=limit)
        answers.append(records)
        await release.wait()
        return records

    monkeypatch.setattr(other_storage.metadata, "scan", late_scan)
    lookup = asyncio.create_task(index.entry_for(stream, 0))
    await eventually(lambda: len(answers) == 1)
    await storage.delete_records(stream, 2)
    await asyncio.sleep(0.2)  # time for the reading engine to hear of it
    release.set()
    found = await lookup
    assert found is not None
    assert found.start == 0  # the answer of its moment
    release.clear()
    again = asyncio.create_task(index.entry_for(stream, 1))
    await eventually(lambda: len(answers) == 2)  # asked of the store: nothing was kept
    release.set()
    assert (await again) is not None
