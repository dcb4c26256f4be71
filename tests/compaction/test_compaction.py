"""Compaction on the embedded default: WAL → Parquet, index swapped, reads unchanged."""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefloe.compaction.planner import plan_task
from icefloe.compaction.service import Compactor
from icefloe.compaction.task import execute
from icefloe.config import Config
from icefloe.ports.compaction import CompactionTask
from icefloe.ports.object_store import RequestKind
from icefloe.storage import reader as reader_module
from icefloe.storage.batch import Compression
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.rebuild import rebuild_groups
from icefloe.storage.rebuilt import RebuiltGroup
from icefloe.storage.records import Record, build_batch, decode_batch
from icefloe.topics.registry import Topic, TopicRegistry
from tests.support.compaction_processes import start_engine_worker_then_wait
from tests.support.storage import count_wal_reads, read_all, wal_read_sizes


def records(n: int, tag: str, start_ts: int = 1_700_000_000_000) -> list[Record]:
    return [
        Record(
            i,
            start_ts + i,
            f"{tag}-{i}".encode(),
            f"value-{tag}-{i}".encode() * 5,
            (("h", str(i).encode()), ("h", None)) if i % 2 else (),
        )
        for i in range(n)
    ]


def comparable(rs: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rs]


async def test_compaction_leaves_what_consumers_read_unchanged(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    topic = await topics.create("orders", 2)
    for i, codec in enumerate(Compression):
        for stream in topic.streams:
            await storage.append(stream, records(40, f"{codec.name}{i}"), compression=codec)
    before = {s: await read_all(storage, s) for s in topic.streams}
    assert await compactor.until_idle() == 1
    for stream in topic.streams:
        entries = await storage.index.scan(stream)
        assert [type(e.location) for e in entries] == [ParquetLocation]
        assert comparable(await read_all(storage, stream)) == comparable(before[stream])


async def test_fetches_smaller_than_a_row_group_rebuild_it_once(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    for _ in range(5):  # a file larger than the footer read, so a row group needs its own GET
        values = [os.urandom(1000).hex().encode() for _ in range(20)]
        await storage.append(stream, [Record(i, 0, None, v) for i, v in enumerate(values)])
    expected = comparable(await read_all(storage, stream))
    await compactor.until_idle()
    [entry] = await storage.index.scan(stream)
    assert isinstance(entry.location, ParquetLocation)
    assert len(entry.location.row_groups) == 1

    store = storage.object_store
    gets = store.stats.requests[RequestKind.GET]
    got: list[Record] = []
    while len(got) < 100:
        batch = await storage.read_records(stream, len(got), max_bytes=1)  # one batch a fetch
        assert [r.offset for r in batch] == list(range(len(got), len(got) + 20))
        got.extend(batch)
    assert comparable(got) == expected
    # The footer and the row group, once for all five fetches.
    assert store.stats.requests[RequestKind.GET] - gets == 2


async def compacted_row_groups(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], count: int
) -> tuple[int, ParquetLocation]:
    """A stream of 2 KB records compacted into one data file of ``count`` row groups (of 8
    batches each), and the file."""
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    for base in range(0, 8 * 64 * count, 64):
        values = [os.urandom(1000).hex().encode() for _ in range(64)]
        await storage.append(stream, [Record(base + i, 0, None, v) for i, v in enumerate(values)])
    await compactor.until_idle()
    [entry] = await storage.index.scan(stream)
    assert isinstance(entry.location, ParquetLocation)
    assert len(entry.location.row_groups) == count
    return stream, entry.location


async def test_a_fetch_inside_a_row_group_has_the_next_group_rebuilt_ahead(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, store = parts[0], parts[0].object_store
    stream, location = await compacted_row_groups(parts, 3)
    _, last_of_first = location.row_groups[0]

    await storage.read_records(stream, 0, max_bytes=1)  # inside the first row group
    gets = store.stats.requests[RequestKind.GET]
    deadline = time.monotonic() + 10
    while store.stats.requests[RequestKind.GET] == gets:  # the second group, unasked
        assert time.monotonic() < deadline, "the next row group was not read ahead"
        await asyncio.sleep(0.01)
    gets = store.stats.requests[RequestKind.GET]  # the group is rebuilt, or a fetch joins it
    records = await storage.read_records(stream, last_of_first + 1, max_bytes=1)
    assert records[0].offset == last_of_first + 1
    assert store.stats.requests[RequestKind.GET] == gets  # the group was there already


async def test_the_next_groups_of_a_file_are_rebuilt_ahead_together(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = parts[0]
    stream, location = await compacted_row_groups(parts, 6)
    rebuilt: list[int] = []  # the groups of each rebuild

    def rebuild(rows: pa.Table, group_rows: list[int], **bounds: int | None) -> list[RebuiltGroup]:
        rebuilt.append(len(group_rows))
        return rebuild_groups(rows, group_rows, **bounds)

    async def rebuilds(count: int) -> list[int]:
        deadline = time.monotonic() + 10
        while len(rebuilt) < count:
            assert time.monotonic() < deadline, f"rebuilds so far: {rebuilt}"
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # and no more
        return rebuilt

    monkeypatch.setattr(reader_module, "rebuild_groups", rebuild)
    await storage.read_records(stream, 0, max_bytes=1)
    assert await rebuilds(2) == [1, 4]  # the first group, then the next four at once
    first_of_third, _ = location.row_groups[2]
    records = await storage.read_records(stream, first_of_third, max_bytes=1)
    assert records[0].offset == first_of_third
    # The next four from the fourth: the fourth and fifth are there, the sixth (the last) not.
    assert await rebuilds(3) == [1, 4, 1]


async def test_reading_the_last_row_group_reads_nothing_ahead(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, store = parts[0], parts[0].object_store
    stream, location = await compacted_row_groups(parts, 2)
    first_of_last, _ = location.row_groups[-1]

    await storage.read_records(stream, first_of_last, max_bytes=1)
    gets = store.stats.requests[RequestKind.GET]
    await asyncio.sleep(0.3)
    assert store.stats.requests[RequestKind.GET] == gets


async def test_a_read_half_full_does_not_start_a_row_group_it_cannot_take_whole(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage = parts[0]
    stream, location = await compacted_row_groups(parts, 3)  # of just under 1 MiB each
    [(_, last_of_first), (_, last_of_second), _] = location.row_groups

    from_start = await storage.read_records(stream, 0, max_bytes=3 << 19)
    assert from_start[-1].offset == last_of_first  # half a group more would fit, not a whole one
    near_the_end = last_of_first + 1 - 128  # the first group's last two batches: a quarter MiB
    from_there = await storage.read_records(stream, near_the_end, max_bytes=3 << 19)
    assert from_there[-1].offset == last_of_second  # less than half full after the first


@pytest.mark.parametrize("config", [{"rebuilt_cache_bytes": 3 << 19}], indirect=True)
async def test_nothing_is_read_ahead_without_room_beside_the_groups_in_use(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, store = parts[0], parts[0].object_store
    stream, location = await compacted_row_groups(parts, 3)  # of about 1 MiB each
    _, last_of_first = location.row_groups[0]

    await storage.read_records(stream, 0, max_bytes=1)  # the cache holds 1.5 MiB
    gets = store.stats.requests[RequestKind.GET]
    await asyncio.sleep(0.3)
    assert store.stats.requests[RequestKind.GET] == gets
    records = await storage.read_records(stream, last_of_first, max_bytes=1)
    assert records[-1].offset == last_of_first
    assert store.stats.requests[RequestKind.GET] == gets  # the first group was kept


async def test_a_row_group_is_decoded_and_rebuilt_in_a_row_group_thread(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage = parts[0]
    stream, _ = await compacted_row_groups(parts, 1)
    rebuilt_on: list[str] = []

    def rebuild(rows: pa.Table, group_rows: list[int], **bounds: int | None) -> list[RebuiltGroup]:
        rebuilt_on.append(threading.current_thread().name)
        return rebuild_groups(rows, group_rows, **bounds)

    monkeypatch.setattr(reader_module, "rebuild_groups", rebuild)
    records = await storage.read_records(stream, 0, max_bytes=1)
    assert records[0].offset == 0
    assert len(rebuilt_on) == 1
    assert rebuilt_on[0].startswith("icefloe-row-groups")


async def test_log_append_time_survives_compaction(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    batch = build_batch([Record(i, 1_000 + i, None, b"v") for i in range(4)])
    await (await storage.submit_batches(stream, batch, log_append_time_ms=5_000))
    before = await storage.read(stream, 0)
    await compactor.until_idle()
    after = await storage.read(stream, 0)

    for data in (before.data, after.data):
        header, decoded = decode_batch(data)
        assert header.attributes & 0x08  # the timestamp type: LogAppendTime
        assert [r.timestamp for r in decoded] == [5_000] * 4


async def test_a_header_key_that_is_not_utf8_is_compacted_with_its_invalid_bytes_replaced(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    """Kafka takes any bytes as a header key (librdkafka can send them), but the tables store
    keys as strings: compaction must not fail on one, and stores it as Kafka's Java consumer
    would show it, with U+FFFD for each invalid byte. Every other field reads back unchanged."""
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    key = b"trace-\xff".decode("utf-8", "surrogateescape")  # as records.py decodes it
    sent = [
        Record(0, 1_000, b"k", b"v", ((key, b"x"), ("ok", b"y"))),
        Record(1, 1_001, None, b"w", (("plain", None),)),
    ]
    await (await storage.submit_batches(stream, build_batch(sent)))

    await compactor.until_idle()

    assert isinstance((await storage.index.scan(stream))[0].location, ParquetLocation)
    got = await storage.read_records(stream, 0)
    assert got == [
        sent[0]._replace(headers=(("trace-\ufffd", b"x"), ("ok", b"y"))),
        sent[1],
    ]


async def test_reads_from_parquet_start_at_any_offset(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    for i in range(5):
        await storage.append(stream, records(20, f"b{i}"))
    await compactor.until_idle()
    for offset in (0, 7, 20, 55, 99):
        got = await storage.read_records(stream, offset)
        assert got[0].offset == offset
        assert got[-1].offset == 99


async def test_timestamp_lookup_works_on_compacted_data(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, records(10, "a", start_ts=1000))
    await storage.append(stream, records(10, "b", start_ts=2000))
    await compactor.until_idle()
    assert await storage.offset_for_timestamp(stream, 1500) == 10
    assert await storage.offset_for_timestamp(stream, 3000) is None


async def test_new_appends_after_compaction_continue_the_offsets(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, records(10, "a"))
    await compactor.until_idle()
    assert await storage.append(stream, records(5, "b")) == 10
    assert [r.offset for r in await read_all(storage, stream)] == list(range(15))
    await compactor.until_idle()
    assert len(await storage.index.scan(stream)) == 2  # two Parquet files


async def test_unreferenced_wal_objects_are_collected_and_reads_still_work(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, records(30, "a"))
    before = await read_all(storage, stream)
    await compactor.until_idle()
    await asyncio.sleep(config.storage.orphan_grace_s + 0.1)
    assert len(await storage.collect_orphans()) >= 1
    assert [info async for info in storage.wal.list()] == []
    async with await StreamStorage.open(config) as fresh:
        assert comparable(await read_all(fresh, stream)) == comparable(before)


async def one_task_over_shared_wal_objects(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> tuple[Topic, CompactionTask]:
    """A topic of four streams written together three times (three WAL objects, each with a
    chunk of every stream), and the one task that compacts all of it."""
    storage, topics, compactor = parts
    topic = await topics.create("t", 4)
    for _ in range(3):
        await asyncio.gather(*(storage.append(s, records(10, "x")) for s in topic.streams))
    plan = await plan_task(storage.index, topics.cached(), compactor._options, 0, force=True)
    assert plan is not None
    [task] = plan.tasks
    return topic, task


async def test_a_task_reads_each_wal_object_once(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], tmp_path: Path
) -> None:
    storage = parts[0]
    _, task = await one_task_over_shared_wal_objects(parts)
    reads = count_wal_reads(storage.wal)
    files = await execute(task, storage.wal, storage.object_store)
    assert sorted(reads) == sorted(task.refs())
    assert len(set(reads)) == len(reads) == 3  # three flushes, each read once
    assert len(files) == 4
    table = pq.read_table(Path(tmp_path, "objects", files[0].path))
    assert table.column("offset").to_pylist() == list(range(30))


async def test_a_task_of_one_stream_reads_only_its_chunks_of_shared_wal_objects(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], tmp_path: Path
) -> None:
    storage = parts[0]
    topic, whole = await one_task_over_shared_wal_objects(parts)
    stream = topic.streams[2]
    task = dataclasses.replace(
        whole,
        ranges=tuple(r for r in whole.ranges if r.stream_id == stream),
        output_paths=tuple(p for p in whole.output_paths if p[0] == stream),
    )
    read_bytes = wal_read_sizes(storage.wal)
    [file] = await execute(task, storage.wal, storage.object_store)
    # Each flush's object holds the four streams' chunks; the task reads its stream's alone.
    assert read_bytes == [r.byte_end - r.byte_start for r in task.ranges]
    objects = {info.ref: info.size for info in [i async for i in storage.wal.list()]}
    assert sum(read_bytes) < sum(objects[r.ref] for r in task.ranges) / 3
    table = pq.read_table(Path(tmp_path, "objects", file.path))
    assert table.column("offset").to_pylist() == list(range(30))


async def test_compacted_entries_keep_the_time_their_records_were_written(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, records(5, "a"))
    written = [e.created_ms for e in await storage.index.scan(stream)]
    await asyncio.sleep(0.05)
    await compactor.until_idle()
    (entry,) = await storage.index.scan(stream)
    assert entry.created_ms == max(written)  # so retention counts from the write, not compaction


def test_engine_workers_exit_when_their_broker_is_killed() -> None:
    spawn = multiprocessing.get_context("spawn")
    report = spawn.Queue()
    broker = spawn.Process(target=start_engine_worker_then_wait, args=(report,))
    broker.start()
    worker = report.get(timeout=60)
    os.kill(broker.pid, signal.SIGKILL)  # type: ignore[arg-type]
    broker.join(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(worker, signal.SIGKILL)
    raise AssertionError("the engine's worker outlived its killed broker")
