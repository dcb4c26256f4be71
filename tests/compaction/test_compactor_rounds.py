"""What the compaction leader's background rounds read and apply: each stream's index from
where its entries in tables end, and retention at its own interval."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from icefloe.compaction.planner import plan_task
from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry


def records(n: int) -> list[Record]:
    return [Record(i, int(time.time() * 1000), None, b"x" * 100) for i in range(n)]


async def test_the_planner_remembers_where_table_entries_end_and_still_finds_new_ones(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], config: Config
) -> None:
    storage, topics, compactor = parts
    options = config.compactor
    topic = await topics.create("t", 2)
    for stream in topic.streams:
        await storage.append(stream, records(10))
    await compactor.until_idle()
    tables_end = {}
    for stream in topic.streams:
        [entry] = await storage.index.scan(stream)
        assert isinstance(entry.location, ParquetLocation)
        tables_end[stream] = entry.end

    now = int(time.time() * 1000)
    compacted_through: dict[int, int] = {}
    nothing = await plan_task(
        storage.index, [topic], options, now, force=True, compacted_through=compacted_through
    )
    assert nothing is None
    assert compacted_through == tables_end

    first = topic.streams[0]
    await storage.append(first, records(5))
    plan = await plan_task(
        storage.index, [topic], options, now, force=True, compacted_through=compacted_through
    )
    assert plan is not None
    [planned] = plan.streams
    assert planned.stream_id == first
    assert [(e.start, e.end) for e in planned.entries] == [(10, 15)]
    assert compacted_through == tables_end  # the new entry is in the WAL, not in tables


async def log_start_after_rounds(tmp_path: Path, retention_check_interval_s: float) -> int:
    """The log start of a ``retention.ms=1`` partition of three entries, written after the
    leader's first round, once the rounds (every 20 ms) have run for a second."""
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "compactor": {
                "interval_s": 0.02,
                "retention_check_interval_s": retention_check_interval_s,
            },
        },
    )
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        stop = asyncio.Event()
        rounds = asyncio.create_task(compactor.run(stop))
        try:
            topic = await topics.create("t", 1, {"retention.ms": "1"})
            stream = topic.streams[0]
            await asyncio.sleep(0.2)  # the first round, with its retention check, is done
            for _ in range(3):
                await storage.append(stream, records(5))
            await asyncio.sleep(1.0)  # rounds every 20 ms
            return await storage.log_start(stream)
        finally:
            stop.set()
            await rounds
            await compactor.close()
            await topics.close()


async def test_retention_is_checked_every_retention_check_interval(tmp_path: Path) -> None:
    # The last entry stays, so the log end never goes back.
    assert await log_start_after_rounds(tmp_path / "often", 0.05) == 10


async def test_rounds_between_retention_checks_leave_expired_entries(tmp_path: Path) -> None:
    assert await log_start_after_rounds(tmp_path / "seldom", 3600) == 0
