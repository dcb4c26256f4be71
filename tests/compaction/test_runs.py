"""Many tasks per run: the planner cuts a backlog into tasks that share no WAL object, the
engine runs them together, and the committer commits all their files in one table commit per
format; several runs in flight commit their sequences in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from icefloe.compaction import planner
from icefloe.compaction.committer import TaskRecord, TaskStream
from icefloe.compaction.planner import (
    FILE_RECORD_BYTES,
    RUN_RECORD_BYTES,
    StreamPlan,
    TaskKind,
    entry_record_bytes,
    plan_of,
    split_by_objects,
    stream_record_bytes,
)
from icefloe.compaction.service import Compactor, Progress
from icefloe.config import Config, load_config
from icefloe.ports.compaction import CompactionTask, WrittenFile
from icefloe.ports.metadata import MAX_VALUE_BYTES, Record
from icefloe.ports.object_store import RequestKind
from icefloe.storage import keys
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
from icefloe.topics.registry import TopicRegistry
from tests.compaction.test_saga_crashes import records, table_rows

# --- the split -----------------------------------------------------------------------------


def entry(stream_id: int, end: int, ref: str, size: int = 100) -> IndexEntry:
    return IndexEntry(stream_id, end, end * size, 10, WalLocation(ref, 0, size), 0, 0, 0, ())


def stream(stream_id: int, refs: list[str]) -> StreamPlan:
    entries = tuple(entry(stream_id, 10 * (i + 1), ref) for i, ref in enumerate(refs))
    return StreamPlan("t", stream_id, stream_id, entries)


def check_split(streams: list[StreamPlan], groups: list[list[StreamPlan]]) -> None:
    """Groups share no object; each stream's entries are cut into consecutive runs, in
    offset order across the groups."""
    objects = [{e.location.ref for s in g for e in s.entries} for g in groups]  # type: ignore[union-attr]
    assert sum(len(o) for o in objects) == len(set().union(*objects))
    for s in streams:
        shares = [p.entries for g in groups for p in g if p.stream_id == s.stream_id]
        assert [e for share in shares for e in share] == list(s.entries)


def test_a_backlog_is_cut_into_tasks_of_about_the_size_each_object_in_one() -> None:
    streams = [stream(1, ["a", "b", "c", "d"]), stream(2, ["a", "b", "c", "d"])]
    groups = split_by_objects(streams, 400)
    assert len(groups) == 2  # four objects of 200 bytes each
    check_split(streams, groups)
    assert [[(p.stream_id, p.start, p.end) for p in g] for g in groups] == [
        [(1, 0, 20), (2, 0, 20)],
        [(1, 20, 40), (2, 20, 40)],
    ]


def test_objects_whose_orders_cross_stay_in_one_task() -> None:
    # Stream 1 went through a then b, stream 2 through b then a (two brokers): a and b
    # cannot be cut apart without one stream's ranges leaving a gap.
    streams = [stream(1, ["a", "b", "c"]), stream(2, ["b", "a", "c"]), stream(3, ["d", "c"])]
    groups = split_by_objects(streams, 1)
    check_split(streams, groups)
    objects = [sorted({e.location.ref for s in g for e in s.entries}) for g in groups]  # type: ignore[union-attr]
    assert ["a", "b"] in objects
    assert len(groups) == 3


def test_a_run_holds_at_most_max_tasks_however_small_the_task_size() -> None:
    streams = [stream(1, list("abcdefghij")), stream(2, list("abcdefghij"))]
    groups = split_by_objects(streams, 1, max_tasks=3)
    assert len(groups) == 3
    check_split(streams, groups)


def test_a_stream_in_one_object_is_one_task() -> None:
    streams = [stream(1, ["a", "a", "a"])]
    assert split_by_objects(streams, 1) == [streams]


# --- runs through the saga -----------------------------------------------------------------


def runs_config(tmp_path: Path, wal: str | None = None, **compactor: Any) -> Config:
    return load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"]},
            "compactor": compactor,
            "compaction": {"local": {"workers": 2}},
        }
        | ({"wal": {"backend": wal}} if wal else {}),
    )


@contextlib.asynccontextmanager
async def open_parts(config: Config) -> AsyncIterator[tuple[StreamStorage, TopicRegistry]]:
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        try:
            yield storage, topics
        finally:
            await topics.close()


async def fill(storage: StreamStorage, topics: TopicRegistry, rounds: int) -> dict[int, Any]:
    """Three partitions; each round one WAL object holding a chunk of each."""
    topic = await topics.create("events", 3)
    for round_ in range(rounds):
        await asyncio.gather(
            *(
                storage.append(s, records(25, f"r{round_}-{s}", 1, 25 * round_))
                for s in topic.streams
            )
        )
    return {
        s: [(r.offset, r.value) for r in await storage.read_records(s, 0, 1 << 24)]
        for s in topic.streams
    }


def wanted(expected: dict[int, Any]) -> list[tuple[int, int, bytes]]:
    return sorted(
        (partition, offset, value)
        for partition, (_, rows) in enumerate(expected.items())
        for offset, value in rows
    )


async def test_one_run_of_many_tasks_reads_each_object_once_and_commits_once(
    tmp_path: Path,
) -> None:
    # WAL objects in the object store: the workers' object-store reads count them.
    config = runs_config(tmp_path, "object", max_task_bytes=4000, max_tasks_per_run=64)
    async with open_parts(config) as (storage, topics):
        expected = await fill(storage, topics, rounds=6)
        objects = {
            e.location.ref
            for s in expected
            for e in await storage.index.scan(s)
            if isinstance(e.location, WalLocation)
        }
        compactor = await Compactor.open(config, storage, topics)
        try:
            runs: list[Progress] = []
            tasks = await compactor.until_idle(runs.append)
            assert len(runs) == 1
            assert tasks == runs[0].tasks > 1
            assert compactor.engine.tasks_finished() == tasks
            assert compactor.engine.stats.requests[RequestKind.GET] == len(objects)
            spec = compactor.committer.table_spec("events")
            for table_format in compactor.table_formats.values():
                assert await table_format.last_commit(spec) == 1  # one commit for the run
            for name, rows in (await table_rows(compactor, "events")).items():
                assert rows == wanted(expected), f"{name}: not every record exactly once"
            for s, rows in expected.items():
                entries = await storage.index.scan(s)
                assert len(entries) == tasks, "a file per task and stream"
                assert all(isinstance(e.location, ParquetLocation) for e in entries)
                read = [(r.offset, r.value) for r in await storage.read_records(s, 0, 1 << 24)]
                assert read == rows
        finally:
            await compactor.close()


async def test_runs_in_flight_are_bounded_and_commit_in_sequence_order(tmp_path: Path) -> None:
    config = runs_config(tmp_path, max_task_bytes=3000, max_tasks_per_run=2, max_runs_in_flight=2)
    async with open_parts(config) as (storage, topics):
        expected = await fill(storage, topics, rounds=8)
        compactor = await Compactor.open(config, storage, topics)
        engine = compactor.engine
        running = peak = 0
        run = engine.run

        async def counted(tasks: list[CompactionTask]) -> list[WrittenFile]:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            try:
                await asyncio.sleep(0.3)  # the other run is planned meanwhile
                return await run(tasks)
            finally:
                running -= 1

        engine.run = counted  # type: ignore[method-assign]
        try:
            runs: list[Progress] = []
            await compactor.until_idle(runs.append)
            assert len(runs) > 2
            assert peak == 2
            spec = compactor.committer.table_spec("events")
            for table_format in compactor.table_formats.values():
                assert await table_format.last_commit(spec) == len(runs)
            for name, rows in (await table_rows(compactor, "events")).items():
                assert rows == wanted(expected), f"{name}: not every record exactly once"
        finally:
            await compactor.close()


@pytest.mark.parametrize("max_runs_in_flight", [1, 3])
async def test_a_background_round_starts_at_most_max_runs_in_flight(
    tmp_path: Path, max_runs_in_flight: int
) -> None:
    config = runs_config(
        tmp_path, max_task_bytes=1000, max_tasks_per_run=1, max_runs_in_flight=max_runs_in_flight
    )
    async with open_parts(config) as (storage, topics):
        await fill(storage, topics, rounds=2)
        compactor = await Compactor.open(config, storage, topics)
        try:
            progress = await compactor.compact_once(force=True)
            assert progress is not None
            assert progress.tasks == max_runs_in_flight
        finally:
            await compactor.close()


def largest_record(topic: str, entries_per_stream: int, file_per_entry: bool) -> TaskRecord:
    """The record of a run filled to the planner's estimate: streams of ``topic`` with
    ``entries_per_stream`` entries each (large offsets, long WAL object names), every file
    with many row groups, and, with ``file_per_entry``, a file per entry (a topic split by
    time)."""
    per_file = FILE_RECORD_BYTES + len(topic) if file_per_entry else 0
    room = RUN_RECORD_BYTES
    streams: list[StreamPlan] = []
    while True:
        s = len(streams)
        room -= stream_record_bytes(topic)
        entries = []
        for i in range(entries_per_stream):
            location = WalLocation(f"wal/{i:064x}", 1 << 30, 1 << 20)
            e = IndexEntry(s, (1 << 40) + i, (1 << 50) + i, 10, location, 0, 0, 0, ())
            if room < entry_record_bytes(e) + per_file:
                break
            room -= entry_record_bytes(e) + per_file
            entries.append(e)
        if not entries:
            break
        streams.append(StreamPlan(topic, s, s, tuple(entries)))
        if len(entries) < entries_per_stream:
            break
    plan = plan_of(streams, {}, TaskKind.COMPACT, (), 1 << 28, 16)
    record = TaskRecord(plan.run_id, list(plan.tasks), [], created_ms=1)
    record.streams = [
        TaskStream(
            s.topic,
            s.partition,
            s.stream_id,
            [keys.index_key(s.stream_id, e.end, e.cumulative_size) for e in s.entries],
        )
        for s in streams
    ]
    record.files = [
        WrittenFile(t.task_id, s, path, 1 << 30, 1 << 20, 1 << 40, 1 << 41, ((1, 2),) * 8, 1, 2)
        for t in plan.tasks
        for s, path in t.output_paths
        for _ in range(sum(r.stream_id == s for r in t.ranges) if file_per_entry else 1)
    ]
    record.sequences = {topic: 1 << 30}
    return record


@pytest.mark.parametrize(
    ("topic_chars", "entries_per_stream", "file_per_entry"),
    [(249, 1, False), (12, 1, False), (12, 5000, False), (249, 5000, False), (12, 5000, True)],
)
def test_the_record_of_the_largest_run_fits_in_a_metadata_value(
    topic_chars: int, entries_per_stream: int, file_per_entry: bool
) -> None:
    record = largest_record("t" * topic_chars, entries_per_stream, file_per_entry)
    assert record.streams, "not even one stream fits"
    assert len(record.encode()) < MAX_VALUE_BYTES


def test_a_far_behind_stream_of_small_entries_is_compacted_in_few_runs() -> None:
    # Entries of 87 KB (the latency profile's, eight partitions): a run takes over 200 MB of
    # one stream, not the 87 MB a thousand entries make.
    record = largest_record("t", 5000, False)
    assert len(record.streams) == 1
    assert len(record.streams[0].replaced) >= 2500


def test_a_run_record_reads_back_as_written() -> None:
    wal = [entry(1, 10, "wal/a"), entry(1, 20, "wal/b"), entry(2, 10, "wal/b")]
    wal_streams = [StreamPlan("t", 0, 1, tuple(wal[:2])), StreamPlan("t", 1, 2, (wal[2],))]
    groups = {end: ((end - 10, end - 1),) for end in (10, 20)}
    parquet = [
        IndexEntry(3, end, end * 100, 10, ParquetLocation(f"f{end}", 1, g), 0, 0, 0, ())
        for end, g in groups.items()
    ]
    plans = [
        plan_of(wal_streams, {}, TaskKind.COMPACT, (), 1 << 28, 16),
        plan_of([StreamPlan("t", 2, 3, tuple(parquet))], {}, TaskKind.REWRITE),
    ]
    for plan in plans:
        written = TaskRecord(plan.run_id, list(plan.tasks), [], created_ms=1)
        read = TaskRecord.decode(Record("k", written.encode(), 7))
        assert read.tasks == written.tasks
        assert read.ranges == written.ranges


async def test_a_run_takes_what_fits_in_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = runs_config(tmp_path)
    async with open_parts(config) as (storage, topics):
        expected = await fill(storage, topics, rounds=4)  # 3 streams of 4 entries
        first = (await storage.index.scan(next(iter(expected))))[0]
        # Room for one stream and five entries: a stream's four, not a second stream too.
        room = stream_record_bytes("events") + 5 * entry_record_bytes(first)
        monkeypatch.setattr(planner, "RUN_RECORD_BYTES", room)
        compactor = await Compactor.open(config, storage, topics)
        try:
            runs: list[Progress] = []
            await compactor.until_idle(runs.append)
            assert [r.streams for r in runs] == [1, 1, 1]
            for name, rows in (await table_rows(compactor, "events")).items():
                assert rows == wanted(expected), f"{name}: not every record exactly once"
        finally:
            await compactor.close()
