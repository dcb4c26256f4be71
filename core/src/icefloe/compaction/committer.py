"""The compaction saga: files written → committed to each table format → index swapped.

Each task is a record in the metadata store that moves through these states by
compare-and-set; a crash anywhere leaves a record that the next leader finishes:

``planned``   the task is chosen; running it writes the Parquet files (deterministic paths and
              contents, so running it again is harmless).
``written``   the files exist; the task holds one commit sequence per table, allocated before
              any commit, so that each format can tell a replay from a new commit.
``committed`` every enabled format has the files (each format skips a sequence it already has).
``swapped``   for each stream, the Parquet entry replaced the WAL entries in the index; the
              record is deleted. The WAL objects, now unreferenced, are collected later.

The index swap keeps readers whole: the Parquet entry is written under the key of the *last*
WAL entry it replaces (same end offset and cumulative size), then the other WAL entries are
deleted from the last to the first, so a look-up always finds an entry holding its offset.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

import msgpack

from icefloe.compaction.planner import Plan
from icefloe.keyspace import COMPACTION, prefix_end
from icefloe.ports.compaction import CompactionEngine, CompactionTask, StreamRange, WrittenFile
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore, Record
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import DataFile, TableFormat, TableSpec
from icefloe.storage import counters, keys
from icefloe.storage.index import IndexEntry, ParquetLocation
from icefloe.storage.offset_index import OffsetIndex
from icefloe.tables import layout

log = logging.getLogger(__name__)

TASKS: Final = COMPACTION + "tasks/"


class SagaState(enum.StrEnum):
    """Where a task is in the saga (see the module docstring)."""

    PLANNED = "planned"
    WRITTEN = "written"
    COMMITTED = "committed"
    SWAPPED = "swapped"
    """Only in memory: a swapped task's record is deleted."""


@dataclass(frozen=True, slots=True)
class TaskStream:
    """One stream a task compacts, and the index entries its Parquet entry replaces."""

    topic: str
    partition: int
    stream_id: int
    replaced: list[str]
    """Index keys of the WAL entries, in offset order; the last one's key is reused."""


@dataclass
class TaskRecord:
    """The persisted state of one compaction task."""

    task: CompactionTask
    streams: list[TaskStream]
    state: SagaState = SagaState.PLANNED
    files: list[WrittenFile] | None = None
    sequences: dict[str, int] | None = None
    created_ms: int = 0
    version: int = MUST_NOT_EXIST

    @property
    def key(self) -> str:
        return TASKS + f"{self.created_ms:015d}-{self.task.task_id}"

    def encode(self) -> bytes:
        payload = {
            "task": [
                self.task.task_id,
                [asdict(r) for r in self.task.ranges],
                [list(p) for p in self.task.output_paths],
            ],
            "streams": [[s.topic, s.partition, s.stream_id, s.replaced] for s in self.streams],
            "state": str(self.state),
            "files": [asdict(f) for f in self.files] if self.files is not None else None,
            "sequences": self.sequences,
            "created_ms": self.created_ms,
        }
        return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, record: Record) -> TaskRecord:
        p = msgpack.unpackb(record.value, raw=False)
        task_id, ranges, outputs = p["task"]
        task = CompactionTask(
            task_id,
            tuple(StreamRange(**r) for r in ranges),
            tuple((int(s), str(k)) for s, k in outputs),
        )
        files = None
        if p["files"] is not None:
            files = [
                WrittenFile(**{**f, "row_groups": tuple(tuple(g) for g in f["row_groups"])})
                for f in p["files"]
            ]
        return cls(
            task,
            [TaskStream(t, pa, s, list(ks)) for t, pa, s, ks in p["streams"]],
            SagaState(p["state"]),
            files,
            p["sequences"],
            p["created_ms"],
            record.version,
        )


class Committer:
    """Runs tasks through the saga; only the compaction leader uses one."""

    def __init__(
        self,
        metadata: MetadataStore,
        offsets: OffsetIndex,
        store: ObjectStore,
        engine: CompactionEngine,
        table_formats: Sequence[TableFormat],
        namespace: str,
        *,
        expire_every: int = 20,
        history_retention_s: float = 3600.0,
    ) -> None:
        self._metadata = metadata
        self._offsets = offsets
        self._store = store
        self._engine = engine
        self._table_formats = list(table_formats)
        self._namespace = namespace
        self._expire_every = expire_every
        self._history_ms = int(history_retention_s * 1000)
        self._ensured: set[tuple[int, str]] = set()

    async def unfinished(self) -> list[TaskRecord]:
        """Tasks a previous leader started and did not finish, oldest first."""
        records = [r async for r in self._metadata.scan_all(TASKS, prefix_end(TASKS))]
        return [TaskRecord.decode(r) for r in records]

    async def start(self, plan: Plan) -> TaskRecord:
        """Persist a new task in state ``planned``."""
        record = TaskRecord(
            plan.task,
            [
                TaskStream(s.topic, s.partition, s.stream_id, [_entry_key(e) for e in s.entries])
                for s in plan.streams
            ],
            created_ms=int(time.time() * 1000),
        )
        await self._save(record)
        return record

    async def finish(self, record: TaskRecord) -> TaskRecord:
        """Take a task from whatever state it is in to the end of the saga."""
        if record.state is SagaState.PLANNED:
            record.files = await self._engine.run([record.task])
            record.sequences = {
                topic: await counters.increment(self._metadata, f"table-sequence/{topic}")
                for topic in sorted({s.topic for s in record.streams})
            }
            record.state = SagaState.WRITTEN
            await self._save(record)
        if record.state is SagaState.WRITTEN:
            await self._commit_tables(record)
            record.state = SagaState.COMMITTED
            await self._save(record)
        if record.state is SagaState.COMMITTED:
            for stream in record.streams:
                await self._swap(record, stream)
            await self._metadata.delete(record.key)
            record.state = SagaState.SWAPPED
        return record

    # --- steps ------------------------------------------------------------------------------

    async def _commit_tables(self, record: TaskRecord) -> None:
        assert record.files is not None
        assert record.sequences is not None
        files_by_topic: dict[str, list[DataFile]] = {}
        topic_of = {s.stream_id: s.topic for s in record.streams}
        partition_of = {s.stream_id: s.partition for s in record.streams}
        now_ms = int(time.time() * 1000)
        for f in record.files:
            topic = topic_of[f.stream_id]
            files_by_topic.setdefault(topic, []).append(
                DataFile(
                    layout.relative_path(self._namespace, topic, f.path),
                    f.size,
                    f.record_count,
                    partition_of[f.stream_id],
                    now_ms,
                )
            )
        for table_format in self._table_formats:
            for topic, files in sorted(files_by_topic.items()):
                spec = self.table_spec(topic)
                if (id(table_format), topic) not in self._ensured:
                    await table_format.ensure_table(spec)
                    self._ensured.add((id(table_format), topic))
                sequence = record.sequences[topic]
                await table_format.commit(spec, sequence, files)
                if sequence % self._expire_every == 0:
                    await table_format.expire(spec, now_ms - self._history_ms)

    async def _swap(self, record: TaskRecord, stream: TaskStream) -> None:
        assert record.files is not None
        file = next(f for f in record.files if f.stream_id == stream.stream_id)
        swapped = await self._offsets.swap(
            stream.replaced,
            ParquetLocation(file.path, file.size, file.row_groups),
            start_offset=file.start_offset,
            min_timestamp=file.min_timestamp,
            max_timestamp=file.max_timestamp,
        )
        if not swapped:
            log.warning(
                "stream %d changed under compaction (topic deleted?); skipping", stream.stream_id
            )

    async def _save(self, record: TaskRecord) -> None:
        written = await self._metadata.put(
            record.key, record.encode(), expected_version=record.version
        )
        record.version = written.version

    def table_spec(self, topic: str) -> TableSpec:
        """The table of ``topic`` in this cluster's object store."""
        return layout.table_spec(self._store, self._namespace, topic)


def _entry_key(entry: IndexEntry) -> str:
    return keys.index_key(entry.stream_id, entry.end, entry.cumulative_size)


def describe(record: TaskRecord) -> dict[str, Any]:
    """A summary of a task for logs and progress output."""
    return {
        "task": record.task.task_id,
        "state": record.state,
        "streams": len(record.streams),
        "wal_objects": len(record.task.refs()),
        "files": len(record.files or ()),
    }
