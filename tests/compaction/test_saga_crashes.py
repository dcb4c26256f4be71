"""Invariant 5 (docs/design.md): the compactor killed at any step of the saga, then restarted,
leaves every record exactly once in the stream and in every table format that is enabled."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.support.compaction_processes import CRASH_POINTS, compact_and_crash

SPAWN = multiprocessing.get_context("spawn")


def records(n: int, tag: str) -> list[Record]:
    return [Record(i, 1_700_000_000_000 + i, tag.encode(), f"{tag}/{i}".encode()) for i in range(n)]


@pytest.mark.parametrize("crash_at", CRASH_POINTS)
async def test_a_compactor_killed_at_any_step_is_finished_by_the_next_one(
    tmp_path: Path, crash_at: str
) -> None:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"]},
        },
    )
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        topic = await topics.create("events", 3)
        for round_ in range(4):
            await asyncio.gather(
                *(storage.append(s, records(25, f"r{round_}-{s}")) for s in topic.streams)
            )
        expected = {
            s: [(r.offset, r.value) for r in await storage.read_records(s, 0, 1 << 24)]
            for s in topic.streams
        }

        child = SPAWN.Process(target=compact_and_crash, args=(config, crash_at))
        child.start()
        await asyncio.to_thread(child.join, 120)
        assert child.exitcode == -9, f"the compactor was not killed at {crash_at}"

        compactor = await Compactor.open(config, storage, topics)
        try:
            await compactor.until_idle()
            for stream in topic.streams:
                entries = await storage.index.scan(stream)
                assert all(isinstance(e.location, ParquetLocation) for e in entries)
                read = [(r.offset, r.value) for r in await storage.read_records(stream, 0, 1 << 24)]
                assert read == expected[stream]
            assert await compactor.committer.unfinished() == []
            wanted = sorted(
                (partition, offset, value)
                for partition, stream in enumerate(topic.streams)
                for offset, value in expected[stream]
            )
            assert len(compactor.table_formats) == 2
            table_root = tmp_path / "objects" / "tables" / "icefloe" / "events"
            for catalog in compactor.table_formats.values():
                files = await catalog.files(compactor.committer.table_spec("events"))
                rows = pa.concat_tables(pq.read_table(table_root / f.path) for f in files)
                in_table = sorted(
                    zip(
                        rows.column("partition").to_pylist(),
                        rows.column("offset").to_pylist(),
                        rows.column("value").to_pylist(),
                        strict=True,
                    )
                )
                assert in_table == wanted  # every record, exactly once
        finally:
            await compactor.close()
            await topics.close()
