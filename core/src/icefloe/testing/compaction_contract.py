"""The CompactionEngine contract suite: the executable form of ``icefloe.ports.compaction``.

A backend opts in with a small class in its tests::

    class TestSparkCompactionEngine(CompactionEngineContract):
        backend_name = "spark"

        def backend_options(self, workdir, unique):
            return {"master": "local[2]"}

Each test writes records through the real stream storage engine, builds compaction tasks from
the stream index (as the planner would), runs them through the engine opened from the plugin
registry, and reads the Parquet files back from the object store: the back door is the object
store itself and the records the storage engine serves. Storage runs on the embedded backends
in the test's folder; an engine whose workers cannot see that folder (a remote cluster)
overrides :meth:`CompactionEngineContract.storage_overrides` to put the WAL and the files
where its workers can reach them.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytest_asyncio

from icefloe.config import Config, load_config
from icefloe.errors import CorruptDataError, NotFoundError
from icefloe.ports.base import PortKind
from icefloe.ports.compaction import (
    CompactionEngine,
    CompactionTask,
    Source,
    StreamRange,
    WrittenFile,
    data_file_name,
)
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TimePartition
from icefloe.storage.batch import Compression
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import WalLocation
from icefloe.storage.records import Record
from icefloe.testing.contract import Contract, open_backend

BASE_TIMESTAMP_MS = 1_700_000_000_000


@dataclass(frozen=True, slots=True)
class WrittenStream:
    """What the suite appended to one stream: its records and each record's batch."""

    stream_id: int
    partition: int
    records: tuple[Record, ...]
    """With the offsets the stream assigned."""
    batch_base_offsets: tuple[int, ...]
    """Per record, the first offset of the batch (append) that holds it."""


class CompactionEngineContract(Contract):
    """Generic tests every :class:`CompactionEngine` adapter passes; see the module docstring."""

    port_kind: ClassVar[PortKind] = PortKind.COMPACTION

    # --- what an implementer may override ---------------------------------------------------

    def storage_overrides(self, workdir: Path, unique: str) -> dict[str, Any]:
        """Configuration sections for the WAL, object store and metadata of one test.

        Args:
            workdir: The test's folder.
            unique: The test's unique string (a bucket prefix for shared servers).

        Returns:
            A nested dict merged over the defaults (embedded backends under ``workdir``), e.g.
            ``{"object_store": {"backend": "s3", "s3": {...}}}``.
        """
        return {}

    # --- fixtures ---------------------------------------------------------------------------

    @pytest.fixture
    def unique(self) -> str:
        return self.new_unique()

    @pytest.fixture
    def options(self, tmp_path: Path, unique: str) -> dict[str, Any]:
        return self.backend_options(tmp_path, unique)

    @pytest.fixture
    def config(self, tmp_path: Path, unique: str, options: dict[str, Any]) -> Config:
        """The whole configuration, as a broker running this engine would have it."""
        overrides: dict[str, Any] = {
            "data_dir": str(tmp_path / unique),
            "storage": {"flush_interval_ms": 5},
            "compaction": {"backend": self.backend_name, self.backend_name: options},
        }
        overrides.update(self.storage_overrides(tmp_path, unique))
        return load_config(env={}, overrides=overrides)

    @pytest_asyncio.fixture
    async def storage(self, config: Config) -> AsyncIterator[StreamStorage]:
        async with await StreamStorage.open(config) as opened:
            yield opened

    @pytest_asyncio.fixture
    async def engine(
        self, tmp_path: Path, options: dict[str, Any], config: Config, storage: StreamStorage
    ) -> AsyncIterator[CompactionEngine]:
        engine = await open_backend(
            self.port_kind,
            self.backend_name,
            tmp_path,
            options,
            storage.object_store,
            wal=storage.wal,
            config=config,
        )
        assert isinstance(engine, CompactionEngine)
        try:
            yield engine
        finally:
            await engine.close()

    # --- one task ---------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_a_task_writes_one_file_per_stream_at_the_path_it_names(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        streams = await write_streams(storage, count=3)
        task = await task_for(storage, streams, "task-1", "out")
        files = await engine.run([task])
        assert sorted((f.task_id, f.stream_id, f.path) for f in files) == sorted(
            ("task-1", stream_id, path) for stream_id, path in task.output_paths
        )
        for f in files:
            assert await storage.object_store.head(f.path) is not None

    @pytest.mark.asyncio
    async def test_each_file_holds_its_streams_records_in_offset_order(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        streams = await write_streams(storage, count=3)
        task = await task_for(storage, streams, "task-1", "out")
        files = {f.stream_id: f for f in await engine.run([task])}
        for stream in streams:
            table = await read_parquet(storage.object_store, files[stream.stream_id].path)
            assert rows_of(table) == expected_rows(stream)

    @pytest.mark.asyncio
    async def test_the_written_file_facts_describe_the_stored_file(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        streams = await write_streams(storage, count=2)
        task = await task_for(storage, streams, "task-1", "out")
        for f in await engine.run([task]):
            [stream] = [s for s in streams if s.stream_id == f.stream_id]
            data = await storage.object_store.get(f.path)
            parquet = pq.ParquetFile(io.BytesIO(data))
            timestamps = [r.timestamp for r in stream.records]
            assert f.size == len(data)
            assert f.record_count == parquet.metadata.num_rows == len(stream.records)
            assert (f.start_offset, f.end_offset) == (0, len(stream.records))
            assert f.row_groups == row_group_ranges(parquet)
            assert (f.min_timestamp, f.max_timestamp) == (min(timestamps), max(timestamps))

    @pytest.mark.asyncio
    async def test_running_a_task_twice_writes_identical_files_at_the_same_paths(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        streams = await write_streams(storage, count=2)
        task = await task_for(storage, streams, "task-1", "out")
        first = await engine.run([task])
        contents = {f.path: await storage.object_store.get(f.path) for f in first}
        second = await engine.run([task])
        assert sorted(second, key=by_stream) == sorted(first, key=by_stream)
        assert {f.path: await storage.object_store.get(f.path) for f in second} == contents

    # --- several tasks, and failures --------------------------------------------------------

    @pytest.mark.asyncio
    async def test_one_run_executes_every_task_and_returns_the_files_of_each(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        streams = await write_streams(storage, count=4)
        tasks = [
            await task_for(storage, streams[:2], "task-a", "a"),
            await task_for(storage, streams[2:], "task-b", "b"),
        ]
        files = await engine.run(tasks)
        assert sorted((f.task_id, f.stream_id) for f in files) == sorted(
            (t.task_id, stream_id) for t in tasks for stream_id, _ in t.output_paths
        )
        for f in files:
            [stream] = [s for s in streams if s.stream_id == f.stream_id]
            assert rows_of(await read_parquet(storage.object_store, f.path)) == expected_rows(
                stream
            )

    @pytest.mark.asyncio
    async def test_ranges_with_a_gap_raise_corrupt_data(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        [stream] = await write_streams(storage, count=1, rounds=3)
        task = await task_for(storage, [stream], "task-1", "out")
        assert len(task.ranges) >= 3, "each round of appends should be its own index entry"
        gapped = CompactionTask(task.task_id, (task.ranges[0], *task.ranges[2:]), task.output_paths)
        with pytest.raises(CorruptDataError, match="gap"):
            await engine.run([gapped])

    @pytest.mark.asyncio
    async def test_a_missing_wal_object_raises_not_found(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        [stream] = await write_streams(storage, count=1, rounds=1)
        task = await task_for(storage, [stream], "task-1", "out")
        for ref in task.refs():
            await storage.wal.delete(ref)
        with pytest.raises(NotFoundError):
            await engine.run([task])

    @pytest.mark.asyncio
    async def test_data_files_of_a_stream_merge_into_one_with_the_same_rows(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        [stream] = await write_streams(storage, count=1, rounds=4)
        whole = await task_for(storage, [stream], "whole", "whole")
        halves = [
            CompactionTask(f"half-{i}", ranges, ((stream.stream_id, f"half/{i}.parquet"),))
            for i, ranges in enumerate((whole.ranges[:2], whole.ranges[2:]))
        ]
        parts = await engine.run(halves)
        merge = CompactionTask(
            "merge",
            tuple(
                StreamRange(
                    f.stream_id,
                    stream.partition,
                    f.start_offset,
                    f.end_offset,
                    f.path,
                    0,
                    f.size,
                    Source.PARQUET,
                )
                for f in sorted(parts, key=lambda f: f.start_offset)
            ),
            ((stream.stream_id, "merged/stream.parquet"),),
        )

        [merged] = await engine.run([merge])

        table = await read_parquet(storage.object_store, "merged/stream.parquet")
        assert rows_of(table) == expected_rows(stream)
        assert (merged.start_offset, merged.end_offset) == (0, len(stream.records))
        assert merged.record_count == len(stream.records)
        timestamps = [r.timestamp for r in stream.records]
        assert (merged.min_timestamp, merged.max_timestamp) == (min(timestamps), max(timestamps))
        parquet = pq.ParquetFile(io.BytesIO(await storage.object_store.get(merged.path)))
        assert merged.row_groups == row_group_ranges(parquet)

    @pytest.mark.asyncio
    async def test_a_stream_split_by_time_gets_one_file_per_hour(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        stream_id = await storage.create_stream("contract-hours")
        hour = TimePartition.HOUR
        first = hour.bucket(BASE_TIMESTAMP_MS) + 1
        at = [(first + i // 10) * hour.millis + i for i in range(30)]  # 10 records per hour
        # One batch straddles the first change of hour; the second change falls between two.
        await storage.append(
            stream_id, [Record(0, ts, None, b"%d" % i) for i, ts in enumerate(at[:15])]
        )
        await storage.append(
            stream_id, [Record(0, ts, None, b"%d" % i) for i, ts in enumerate(at[15:], 15)]
        )
        [stream] = [WrittenStream(stream_id, 0, (), ())]
        task = await task_for(storage, [stream], "hours", "out")
        task = CompactionTask(task.task_id, task.ranges, task.output_paths, ((stream_id, hour),))

        written = sorted(await engine.run([task]), key=lambda f: f.start_offset)

        assert [(f.start_offset, f.end_offset, f.time_bucket) for f in written] == [
            (0, 10, first),
            (10, 20, first + 1),
            (20, 30, first + 2),
        ]
        assert [f.path for f in written] == [
            f"out/{data_file_name(stream_id, a, b)}" for a, b in ((0, 10), (10, 20), (20, 30))
        ]
        values = []
        for f in written:
            table = await read_parquet(storage.object_store, f.path)
            assert table.column("offset").to_pylist() == list(range(f.start_offset, f.end_offset))
            assert (f.min_timestamp, f.max_timestamp) == (at[f.start_offset], at[f.end_offset - 1])
            values += table.column("value").to_pylist()
        assert values == [b"%d" % i for i in range(30)]

    @pytest.mark.asyncio
    async def test_a_data_file_that_does_not_hold_its_range_raises_corrupt_data(
        self, engine: CompactionEngine, storage: StreamStorage
    ) -> None:
        [stream] = await write_streams(storage, count=1, rounds=2)
        [written] = await engine.run([await task_for(storage, [stream], "whole", "whole")])
        # A range may hold more offsets than the file has rows (log compaction and aborted
        # transactions leave gaps), never fewer: here the file holds an offset before it.
        wrong = StreamRange(
            stream.stream_id,
            stream.partition,
            written.start_offset + 1,
            written.end_offset,
            written.path,
            0,
            written.size,
            Source.PARQUET,
        )
        task = CompactionTask("merge", (wrong,), ((stream.stream_id, "merged/x.parquet"),))
        with pytest.raises(CorruptDataError, match="holds offsets"):
            await engine.run([task])

    @pytest.mark.asyncio
    async def test_an_empty_task_list_returns_no_files(self, engine: CompactionEngine) -> None:
        assert await engine.run([]) == []


# --- helpers (public: opt-in modules may use them for backend-only tests) --------------------


async def write_streams(
    storage: StreamStorage, *, count: int, rounds: int = 3, per_append: int = 25
) -> list[WrittenStream]:
    """Append ``rounds`` batches to each of ``count`` new streams, the streams concurrently,
    so that WAL objects hold chunks of several streams; codecs, keys and headers vary."""
    ids = [await storage.create_stream(f"contract-{i}") for i in range(count)]
    records: dict[int, list[Record]] = {s: [] for s in ids}
    bases: dict[int, list[int]] = {s: [] for s in ids}
    codecs = list(Compression)
    for round_ in range(rounds):

        async def append(stream_id: int, round_: int = round_) -> None:
            batch = make_records(f"s{stream_id}r{round_}", per_append, round_ * per_append)
            first = await storage.append(
                stream_id, batch, compression=codecs[(round_ + stream_id) % len(codecs)]
            )
            records[stream_id].extend(r._replace(offset=first + i) for i, r in enumerate(batch))
            bases[stream_id].extend([first] * len(batch))

        await asyncio.gather(*(append(s) for s in ids))
    return [
        WrittenStream(s, partition, tuple(records[s]), tuple(bases[s]))
        for partition, s in enumerate(ids)
    ]


def make_records(tag: str, n: int, first_index: int) -> list[Record]:
    """Records with null and non-null keys, empty and repeated headers, null header values."""
    out = []
    for i in range(first_index, first_index + n):
        key = None if i % 5 == 0 else f"{tag}-key-{i}".encode()
        headers: tuple[tuple[str, bytes | None], ...] = (
            (("h", str(i).encode()), ("h", None)) if i % 2 else ()
        )
        out.append(Record(0, BASE_TIMESTAMP_MS + 7 * i, key, f"{tag}-{i}".encode() * 4, headers))
    return out


async def task_for(
    storage: StreamStorage, streams: Sequence[WrittenStream], task_id: str, prefix: str
) -> CompactionTask:
    """A task compacting every WAL entry of ``streams`` into ``<prefix>/stream-<id>.parquet``."""
    ranges = []
    for stream in streams:
        for entry in await storage.index.scan(stream.stream_id):
            location = entry.location
            assert isinstance(location, WalLocation), "the suite compacts WAL entries only"
            ranges.append(
                StreamRange(
                    stream.stream_id,
                    stream.partition,
                    entry.start,
                    entry.end,
                    location.ref,
                    location.position,
                    location.position + location.length,
                )
            )
    outputs = tuple((s.stream_id, f"{prefix}/stream-{s.stream_id}.parquet") for s in streams)
    return CompactionTask(task_id, tuple(ranges), outputs)


async def read_parquet(store: ObjectStore, path: str) -> pa.Table:
    return pq.read_table(io.BytesIO(await store.get(path)))


def rows_of(table: pa.Table) -> list[tuple[Any, ...]]:
    """The rows of a data file as comparable tuples (timestamps in milliseconds)."""
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    return [
        (
            row["partition"],
            row["offset"],
            ts // 1000,
            row["key"],
            row["value"],
            tuple((h["key"], h["value"]) for h in row["headers"]),
            row["batch_base_offset"],
        )
        for row, ts in zip(table.to_pylist(), micros, strict=True)
    ]


def expected_rows(stream: WrittenStream) -> list[tuple[Any, ...]]:
    """What :func:`rows_of` must return for the file of ``stream``."""
    return [
        (stream.partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers), base)
        for r, base in zip(stream.records, stream.batch_base_offsets, strict=True)
    ]


def row_group_ranges(parquet: pq.ParquetFile) -> tuple[tuple[int, int], ...]:
    """(first, last) offset of each row group, from the file's column statistics."""
    column = parquet.schema_arrow.get_field_index("offset")
    ranges = []
    for i in range(parquet.metadata.num_row_groups):
        stats = parquet.metadata.row_group(i).column(column).statistics
        ranges.append((stats.min, stats.max))
    return tuple(ranges)


def by_stream(file: WrittenFile) -> tuple[str, int]:
    return file.task_id, file.stream_id
