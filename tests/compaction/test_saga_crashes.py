"""Invariant 5 (docs/design.md): the compactor killed at any step of the saga, then restarted,
leaves every record exactly once in the stream and in every table format that is enabled.

The saga runs compaction (WAL entries into data files, one per partition, or one per hour of
an hourly table) and table maintenance (small data files merged into one); each is killed at
every step, on the local store, and compaction also on S3 (MinIO) and in runs of several tasks
with two runs in flight (``runs``)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record
from icefloe.tables import layout
from icefloe.topics.configs import REWRITE_MIN_FILES_CONFIG, TIME_PARTITION_CONFIG
from icefloe.topics.registry import Topic, TopicRegistry
from tests.support.compaction_processes import CRASH_POINTS, compact_and_crash, preloaded_processes
from tests.support.object_servers import minio_options

PROCESSES = preloaded_processes()
ROUNDS = 4


def records(n: int, tag: str, step_ms: int = 1, first: int = 0) -> list[Record]:
    """``n`` records stamped ``step_ms`` apart, the first as the ``first``-th would be."""
    return [
        Record(i, 1_700_000_000_000 + step_ms * (first + i), tag.encode(), f"{tag}/{i}".encode())
        for i in range(n)
    ]


def saga_config(tmp_path: Path, store: str, work: str = "compact") -> Config:
    overrides: dict[str, Any] = {
        "data_dir": str(tmp_path),
        "storage": {"flush_interval_ms": 2},
        "table": {"formats": ["iceberg", "delta"]},
    }
    if work == "runs":  # a partition's four WAL chunks in two tasks; a run per partition
        overrides["compactor"] = {
            "max_task_bytes": 1000,
            "max_tasks_per_run": 2,
            "max_runs_in_flight": 2,
        }
    if store == "minio":
        overrides["object_store"] = {"backend": "s3", "s3": minio_options(uuid.uuid4().hex)}
    return load_config(env={}, overrides=overrides)


async def fill(storage: StreamStorage, topics: TopicRegistry, config: Config, work: str) -> Topic:
    """A topic with ``ROUNDS`` appends per partition; for a rewrite, each round is compacted
    on its own, so every partition has ``ROUNDS`` small data files to merge; for ``hourly``,
    the tables are partitioned by hour and every append spans two hours or more."""
    configs = {REWRITE_MIN_FILES_CONFIG: str(ROUNDS)}
    if work == "hourly":
        configs[TIME_PARTITION_CONFIG] = "hour"
    topic = await topics.create("events", 3, configs)
    step_ms = 7 * 60_000 if work == "hourly" else 1
    compactor = await Compactor.open(config, storage, topics) if work == "rewrite" else None
    try:
        for round_ in range(ROUNDS):
            await asyncio.gather(
                *(
                    storage.append(s, records(25, f"r{round_}-{s}", step_ms, 25 * round_))
                    for s in topic.streams
                )
            )
            if compactor is not None:
                await compactor.until_idle()
    finally:
        if compactor is not None:
            await compactor.close()
    return topic


async def table_rows(compactor: Compactor, topic: str) -> dict[str, list[tuple[int, int, bytes]]]:
    """Each format's rows of ``topic``'s table as (partition, offset, value), sorted."""
    store = compactor.storage.object_store
    spec = compactor.committer.table_spec(topic)
    root = layout.table_root(topic)
    rows = {}
    for name, table_format in compactor.table_formats.items():
        files = await table_format.files(spec)
        tables = [pq.read_table(pa.py_buffer(await store.get(f"{root}/{f.path}"))) for f in files]
        table = pa.concat_tables(tables)
        rows[name] = sorted(
            zip(
                table.column("partition").to_pylist(),
                table.column("offset").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )
    return rows


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
@pytest.mark.parametrize(
    ("store", "work"),
    [
        ("local", "compact"),
        ("local", "rewrite"),
        ("local", "hourly"),
        ("minio", "compact"),
        ("local", "runs"),
    ],
)
async def test_a_compactor_killed_at_any_step_is_finished_by_the_next_one(
    tmp_path: Path, store: str, work: str, crash_at: str
) -> None:
    config = saga_config(tmp_path, store, work)
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        topic = await fill(storage, topics, config, work)
        expected = {
            s: [(r.offset, r.value) for r in await storage.read_records(s, 0, 1 << 24)]
            for s in topic.streams
        }

        child = PROCESSES.Process(target=compact_and_crash, args=(config, crash_at, work))
        child.start()
        await asyncio.to_thread(child.join, 120)
        assert child.exitcode == -9, f"the compactor was not killed at {crash_at}"

        compactor = await Compactor.open(config, storage, topics)
        try:
            await compactor.until_idle()  # finishes the task the killed compactor left
            while work == "rewrite" and await compactor.rewrite_once() is not None:
                pass
            for stream in topic.streams:
                entries = await storage.index.scan(stream)
                assert all(isinstance(e.location, ParquetLocation) for e in entries)
                if work == "rewrite":
                    assert len(entries) == 1, "the small files were not merged into one"
                if work == "runs":
                    assert len(entries) == 2, "a partition's run was not cut into two tasks"
                read = [(r.offset, r.value) for r in await storage.read_records(stream, 0, 1 << 24)]
                assert read == expected[stream]
            assert await compactor.committer.unfinished() == []
            wanted = sorted(
                (partition, offset, value)
                for partition, stream in enumerate(topic.streams)
                for offset, value in expected[stream]
            )
            rows = await table_rows(compactor, "events")
            assert set(rows) == {"iceberg", "delta"}
            for name, in_table in rows.items():
                assert in_table == wanted, f"{name}: not every record exactly once"
        finally:
            await compactor.close()
            await topics.close()
