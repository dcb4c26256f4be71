"""What the compaction leader's background rounds read and apply: each stream's index entries
written since the last round, and retention at its own interval."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from icefloe import metrics
from icefloe.compaction.planner import FUTURE_STAMP_TOLERANCE_MS, StreamBacklog, plan_task
from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.compaction.conftest import opened_parts


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
    backlogs: dict[int, StreamBacklog] = {}
    nothing = await plan_task(storage.index, [topic], options, now, force=True, backlogs=backlogs)
    assert nothing is None
    assert {stream: b.tables_end for stream, b in backlogs.items()} == tables_end
    assert all(b.oldest_ms is None for b in backlogs.values())

    first = topic.streams[0]
    await storage.append(first, records(5))
    plan = await plan_task(storage.index, [topic], options, now, force=True, backlogs=backlogs)
    assert plan is not None
    [planned] = plan.streams
    assert planned.stream_id == first
    assert [(e.start, e.end) for e in planned.entries] == [(10, 15)]
    assert backlogs[first].tables_end == tables_end[first]  # the new entry is in the WAL
    assert (backlogs[first].records, backlogs[first].read_end) == (5, 15)


async def test_a_round_reads_only_the_entries_written_since_the_last(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
    config: Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    storage, topics, _ = parts
    options = config.compactor.model_copy(update={"max_age_s": 3600, "min_bytes": 1 << 30})
    topic = await topics.create("t", 1)
    [stream] = topic.streams
    for _ in range(3):
        await storage.append(stream, records(10))
    backlogs: dict[int, StreamBacklog] = {}
    now = int(time.time() * 1000)
    assert await plan_task(storage.index, [topic], options, now, backlogs=backlogs) is None
    assert (backlogs[stream].records, backlogs[stream].read_end) == (30, 30)

    read_from = record_index_reads(storage, monkeypatch)
    assert await plan_task(storage.index, [topic], options, now, backlogs=backlogs) is None
    assert read_from == [], "nothing was written, yet the round read the index"
    await storage.append(stream, records(10))
    assert await plan_task(storage.index, [topic], options, now, backlogs=backlogs) is None
    assert read_from == [30], "the round read entries it had read before"
    assert (backlogs[stream].records, backlogs[stream].read_end) == (40, 40)

    due = options.model_copy(update={"min_age_s": 0, "max_age_s": 0})
    later = int(time.time() * 1000)
    plan = await plan_task(storage.index, [topic], due, later, backlogs=backlogs)
    assert plan is not None  # due now: its WAL entries are read whole
    assert [(e.start, e.end) for e in plan.streams[0].entries] == [
        (i, i + 10) for i in (0, 10, 20, 30)
    ]


@pytest.mark.parametrize("ahead_s", [0.5, 300])
async def test_entries_stamped_by_a_clock_far_ahead_do_not_wait_for_it(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], config: Config, ahead_s: float
) -> None:
    # The compactor's clock `ahead_s` behind the writer's: as when a broker's clock is ahead.
    storage, topics, _ = parts
    options = config.compactor.model_copy(
        update={"min_age_s": 2, "max_age_s": 30, "min_bytes": 1 << 30}
    )
    topic = await topics.create("t", 1)
    [stream] = topic.streams
    await storage.append(stream, records(10))
    behind = int((time.time() - ahead_s) * 1000)
    plan = await plan_task(storage.index, [topic], options, behind)
    if ahead_s < FUTURE_STAMP_TOLERANCE_MS / 1000:
        assert plan is None  # young, as entries just written are
    else:
        assert plan is not None, "the tables would wait for the writer's clock"
        assert [(e.start, e.end) for e in plan.streams[0].entries] == [(0, 10)]


async def test_after_a_run_a_stream_is_judged_by_its_new_entries_alone(
    parts: tuple[StreamStorage, TopicRegistry, Compactor], config: Config
) -> None:
    storage, topics, compactor = parts
    # Due once 5,000 bytes wait; never by age (an hour).
    configs = {"icefloe.compaction.min.bytes": "5000", "icefloe.compaction.max.age.ms": "3600000"}
    topic = await topics.create("t", 1, configs)
    [stream] = topic.streams
    await storage.append(stream, records(100))  # about 10 KB
    await asyncio.sleep(config.compactor.min_age_s + 0.05)  # old enough to be taken
    assert await compactor.compact_once() is not None
    await storage.append(stream, records(1))
    await asyncio.sleep(config.compactor.min_age_s + 0.05)
    # A backlog still counting the compacted bytes would make the stream due again.
    assert await compactor.compact_once() is None
    kinds = [entry.in_wal for entry in await storage.index.scan(stream)]
    assert kinds == [False, True]


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


async def test_after_a_run_the_rest_of_a_stream_far_behind_is_not_read_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs of one task of about 2 KB: six entries of 1 KB take several.
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "compactor": {"max_task_bytes": 2000, "max_tasks_per_run": 1, "max_runs_in_flight": 1},
        },
    )
    async with opened_parts(config) as (storage, topics, compactor):
        topic = await topics.create("t", 1)
        [stream] = topic.streams
        for _ in range(6):
            await storage.append(stream, records(10))
        await compactor.report_backlog()  # sums the stream up once
        assert await compactor.compact_once(force=True) is not None
        left = sum(e.record_count for e in await storage.index.scan(stream) if e.in_wal)
        assert 0 < left < 60, "the run should have taken some entries, not all"

        read_from = record_index_reads(storage, monkeypatch)
        await compactor.report_backlog()
        assert read_from == [], "the backlog was read again after the run"
        read_again = await compactor.backlog(topic)  # summed up from the index afresh
        assert read_again[0] == left
        kept = (
            metrics.COMPACTION_BACKLOG_RECORDS.labels("t")._value.get(),
            metrics.COMPACTION_BACKLOG_BYTES.labels("t")._value.get(),
        )
        assert kept == read_again


def record_index_reads(storage: StreamStorage, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the ``after_end`` of every read of the index's entries, in order."""
    read_from: list[int] = []
    entries = storage.index.entries

    def recording_entries(stream_id: int, after_end: int = 0) -> Any:
        read_from.append(after_end)
        return entries(stream_id, after_end)

    monkeypatch.setattr(storage.index, "entries", recording_entries)
    return read_from
