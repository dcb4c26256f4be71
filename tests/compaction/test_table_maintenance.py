"""Table maintenance on the embedded default with both table formats: small files merged in the
tables and the index alike, retired files deleted after their grace period, retention that
deletes table rows, and orphaned files cleaned up."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record
from icefloe.tables import layout
from icefloe.topics.configs import (
    ORPHAN_AGE_CONFIG,
    REWRITE_MIN_FILES_CONFIG,
    TABLE_RETENTION_CONFIG,
)
from icefloe.topics.registry import Topic
from tests.compaction.conftest import Parts
from tests.compaction.test_saga_crashes import table_rows


@pytest.fixture
def parts(table_parts: Parts) -> Parts:
    """Storage, topics and a compactor with both table formats on."""
    return table_parts


async def small_files(parts: Parts, rounds: int, **configs: str) -> Topic:
    """A two-partition topic whose every round of records was compacted on its own."""
    storage, topics, compactor = parts
    topic = await topics.create("events", 2, configs)
    for round_ in range(rounds):
        for stream in topic.streams:
            records = [
                Record(i, 1_700_000_000_000 + i, None, f"r{round_}/{i}".encode()) for i in range(20)
            ]
            await storage.append(stream, records)
        await compactor.until_idle()
    return topic


async def stream_contents(storage: StreamStorage, topic: Topic) -> list[list[tuple[int, bytes]]]:
    return [
        [(r.offset, r.value or b"") for r in await storage.read_records(s, 0, 1 << 24)]
        for s in topic.streams
    ]


async def data_files(storage: StreamStorage, topic: str) -> set[str]:
    root = layout.table_root(topic) + "/partition="
    return {info.key async for info in storage.object_store.list(root)}


async def test_a_rewrite_merges_small_files_in_the_tables_and_the_index_alike(
    parts: Parts,
) -> None:
    storage, _, compactor = parts
    topic = await small_files(parts, 5, **{REWRITE_MIN_FILES_CONFIG: "3"})
    before = await stream_contents(storage, topic)
    rows_before = await table_rows(compactor, "events")
    small = await data_files(storage, "events")
    assert len(small) == 10

    rewrites = 0
    while await compactor.rewrite_once() is not None:
        rewrites += 1

    assert rewrites == 2  # one per partition
    for stream in topic.streams:
        [entry] = await storage.index.scan(stream)
        assert isinstance(entry.location, ParquetLocation)
        assert (entry.start, entry.end) == (0, 100)
    assert await stream_contents(storage, topic) == before
    assert await table_rows(compactor, "events") == rows_before
    spec = compactor.committer.table_spec("events")
    for table_format in compactor.table_formats.values():
        assert len(await table_format.files(spec)) == 2

    # The small files are retired, not deleted: a reader may still hold their old entries.
    assert await compactor.committer.retired() == small
    assert await data_files(storage, "events") >= small
    assert await compactor.committer.delete_retired(int(time.time() * 1000)) == []
    later = int((time.time() + 3 * 3600) * 1000)
    assert set(await compactor.committer.delete_retired(later)) == small
    assert await compactor.committer.retired() == set()
    assert len(await data_files(storage, "events")) == 2
    assert await stream_contents(storage, topic) == before


async def test_files_under_the_small_file_limit_are_left_alone(parts: Parts) -> None:
    _, _, compactor = parts
    await small_files(parts, 2, **{REWRITE_MIN_FILES_CONFIG: "3"})
    assert await compactor.rewrite_once() is None


async def test_retention_with_delete_takes_expired_files_out_of_the_tables(parts: Parts) -> None:
    storage, _, compactor = parts
    topic = await small_files(parts, 3, **{"retention.ms": "1", TABLE_RETENTION_CONFIG: "delete"})
    first_files = {e.location.key for s in topic.streams for e in (await storage.index.scan(s))[:2]}
    await asyncio.sleep(0.05)

    assert await compactor.enforce_retention() == 4  # two entries per partition; the last stays

    for stream in topic.streams:
        [entry] = await storage.index.scan(stream)
        assert (entry.start, entry.end) == (40, 60)
    wanted = sorted((p, o, f"r2/{o - 40}".encode()) for p in (0, 1) for o in range(40, 60))
    for name, rows in (await table_rows(compactor, "events")).items():
        assert rows == wanted, name
    assert await compactor.committer.retired() == first_files


async def test_retention_with_keep_leaves_the_tables_whole(parts: Parts) -> None:
    storage, _, compactor = parts
    topic = await small_files(parts, 3, **{"retention.ms": "1"})
    rows_before = await table_rows(compactor, "events")
    await asyncio.sleep(0.05)

    assert await compactor.enforce_retention() == 4

    assert [len(await storage.index.scan(s)) for s in topic.streams] == [1, 1]
    assert await table_rows(compactor, "events") == rows_before
    assert await compactor.committer.retired() == set()


async def test_orphaned_data_files_are_deleted_and_referenced_ones_kept(parts: Parts) -> None:
    storage, _, compactor = parts
    await small_files(parts, 2, **{ORPHAN_AGE_CONFIG: "0"})
    live = await data_files(storage, "events")
    root = layout.table_root("events")
    stray = f"{root}/partition=0/00000000000000000000-00000000000000000007.parquet"
    await storage.object_store.put(stray, b"left by a crash")
    other = f"{root}/notes.txt"
    await storage.object_store.put(other, b"not a data file")
    await asyncio.sleep(0.01)

    assert await compactor.collect_garbage() == [stray]

    assert await data_files(storage, "events") == live
    assert await storage.object_store.head(other) is not None  # not a data file: not touched


async def test_many_orphans_are_logged_in_one_line(
    parts: Parts, caplog: pytest.LogCaptureFixture
) -> None:
    storage, _, compactor = parts
    await small_files(parts, 1, **{ORPHAN_AGE_CONFIG: "0"})
    strays = [layout.data_file("events", 0, f"stray-{i}.parquet") for i in range(50)]
    for key in strays:
        await storage.object_store.put(key, b"left by a crash")
    await asyncio.sleep(0.01)

    with caplog.at_level(logging.INFO, logger="icefloe.compaction.maintenance"):
        assert sorted(await compactor.collect_garbage()) == sorted(strays)

    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert line.startswith("deleted 50 orphaned data files (tables/events/partition=0/stray-0")
    assert line.endswith(", …) of topic events")


async def test_orphans_stay_when_cleanup_is_off(parts: Parts) -> None:
    storage, _, compactor = parts
    await small_files(parts, 1, **{ORPHAN_AGE_CONFIG: "-1"})
    stray = layout.data_file("events", 0, "stray.parquet")
    await storage.object_store.put(stray, b"left by a crash")

    assert await compactor.collect_garbage() == []
    assert await storage.object_store.head(stray) is not None


async def test_a_maintenance_round_merges_and_collects(parts: Parts) -> None:
    storage, _, compactor = parts
    topic = await small_files(parts, 4, **{REWRITE_MIN_FILES_CONFIG: "4", ORPHAN_AGE_CONFIG: "0"})
    stray = layout.data_file("events", 1, "stray.parquet")
    await storage.object_store.put(stray, b"left by a crash")
    await asyncio.sleep(0.01)

    await compactor.maintain()  # what the leader runs every maintenance_interval_s

    assert [len(await storage.index.scan(s)) for s in topic.streams] == [1, 1]
    assert len(await compactor.committer.retired()) == 8  # kept for the history period
    assert await storage.object_store.head(stray) is None
