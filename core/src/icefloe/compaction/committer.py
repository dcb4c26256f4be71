"""The compaction saga: files written → committed to each table format → index swapped.

Each run (one or more tasks, see :class:`~icefloe.compaction.planner.Plan`) is a record in the
metadata store that moves through these states by compare-and-set; a crash anywhere leaves a
record that the next leader finishes:

``planned``   the run is chosen; running its tasks writes the Parquet files (deterministic
              paths and contents, so running them again is harmless).
``written``   the files of every task exist; the run holds one commit sequence per table,
              allocated before any commit, so that each format can tell a replay from a new
              commit. All of a run's files go to a table in that one commit.
``committed`` every enabled format has the new files and no longer has the retired ones (each
              format skips a sequence it already has).
``swapped``   for each stream, the index changed to match; the record is deleted.

Four kinds of task share the saga (:class:`TaskKind`): *compact* turns WAL entries into one
data file per stream; *rewrite* merges a stream's small data files into one (table
maintenance); *expire* removes entries past retention from the index and, when the topic's
``icefloe.table.retention`` is ``delete``, their files from the tables; *clean* log-compacts
a stream's data files (one new file for each, or for a run of files of which only the last
kept records), and once its entries are swapped records how far the stream is clean
(``compaction/cleaned/<stream id>``: the end of the cleaned offsets and when the earliest
tombstone kept may go), which the log-compaction planner reads.

Several runs may be in flight (``[compactor] max_runs_in_flight``), but one at a time goes
from ``planned`` to ``committed``: a run takes its sequences and commits them before another
takes any, so tables receive sequences in order, and a crash leaves at most one run in
``written`` (:meth:`Committer.unfinished` lists it before any ``planned`` one).

A run that fails is counted in its record (``failures``, the last ``error``); the next round
tries it again, and the streams it holds are left out of new runs meanwhile. After
:data:`SET_ASIDE_AFTER` failures in a row it is *set aside*, unless what failed last passes
by itself: a store out of reach (a retriable error: an object store or metadata store down,
throttling, cut off) or a lost race (a conflict: a table's log listed stale). Those are tried
again round after round, since the run succeeds once they end, and an operator should not have
to notice them. Set aside, ``retry_after_ms`` says when it is
tried again (``[compactor] set_aside_retry_s``, doubling with each failure after that, at most
:data:`MAX_SET_ASIDE_FACTOR` times), or at once after ``icefloe tables retry``. A run
that failed on some topics of a multi-topic run only is split: those topics' part becomes a run
of its own (keyed after the run, a suffix per topic) and the rest goes on. A run that failed
once commits each topic as a run that may have been overtaken: a format that holds its files
already is skipped, and a topic whose sequence a later run of it passed in a format takes a
new sequence first (:meth:`Committer._commit_topic`).

Each record carries the term of the leader that wrote it last (:mod:`.leadership`); a new
leader claims every unfinished record before it acts on it, so that an old leader's late step
fails on the record's version.

The index swap keeps readers whole: the new Parquet entry is written under the key of the
*last* entry it replaces (same end offset and cumulative size), then the other entries are
deleted from the last to the first, so a look-up always finds an entry holding its offset.

A range that keeps no rows (only an aborted transaction and markers, say) still becomes a data
file without rows, so that its offsets stay held by an index entry that reads as nothing; the
tables never get such a file (Iceberg refuses one: a file's partition comes from its rows), nor
a commit for a topic whose run wrote only such files. A rewrite that merges it retires it like
any other file; the tables, which never had it, are not asked to remove it.

A data file that a rewrite or an expiry took out of the tables and the index is *retired*, not
deleted: a reader may still hold its old index entry, and older table snapshots still
reference it. The retirement record (``compaction/retired/…``) is written before the task
record goes, and the file is deleted once the record's grace period is over. WAL objects no
entry references any more are collected by :mod:`icefloe.storage.orphans`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, astuple, dataclass, field
from typing import Any, Final

import msgpack

from icefloe import metrics
from icefloe.compaction.leadership import UNLEADED, LeadershipLostError, Lease
from icefloe.compaction.planner import Plan, TaskKind
from icefloe.errors import AlreadyExistsError, ConflictError, IcefloeError
from icefloe.keyspace import COMPACTION, prefix_end
from icefloe.ports.compaction import (
    CleanSpec,
    CompactionEngine,
    CompactionTask,
    Source,
    StreamRange,
    WrittenFile,
)
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore, Record
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import DataFile, TableFormat, TableSpec, TimePartition
from icefloe.storage import counters, index, keys
from icefloe.storage.index import IndexEntry, ParquetLocation
from icefloe.storage.offset_index import NewPiece, OffsetIndex
from icefloe.tables import layout

log = logging.getLogger(__name__)

TASKS: Final = COMPACTION + "tasks/"
RETIRED: Final = COMPACTION + "retired/"
CLEANED: Final = COMPACTION + "cleaned/"
MIN_RETIRED_GRACE_MS: Final = 60_000
"""A retired file outlives any fetch that found it in the index before the swap."""
SET_ASIDE_AFTER: Final = 3
"""Failures in a row after which a run is set aside (module docstring)."""
MAX_SET_ASIDE_FACTOR: Final = 8
"""A set-aside run waits at most this many times ``set_aside_retry_s`` between tries."""
ERROR_CHARS: Final = 500
"""How much of a failure's message a record keeps."""


class TopicsFailedError(IcefloeError):
    """Some topics of a run could not be committed to their tables."""

    def __init__(self, failures: Mapping[str, BaseException]) -> None:
        self.failures = dict(failures)
        super().__init__(
            "; ".join(f"topic {t!r}: {_one_line(e)}" for t, e in sorted(self.failures.items()))
        )


def _passing(error: BaseException) -> bool:
    """Whether ``error`` is one a later try gets past by itself (every topic's failure, for a
    run of several): a store out of reach (a retriable error), or a race lost to another
    writer or to a store's stale view (a conflict)."""
    if isinstance(error, TopicsFailedError):
        return all(_passing(e) for e in error.failures.values())
    return isinstance(error, ConflictError) or (isinstance(error, IcefloeError) and error.retriable)


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
    """Index keys of the entries the task replaces (or removes), in offset order; a new
    Parquet entry reuses the last one's key."""
    retired: list[str] = field(default_factory=list)
    """Object keys of the data files that leave the tables and the index."""


@dataclass(frozen=True, slots=True)
class Cleaned:
    """How far log compaction has cleaned a stream."""

    end: int
    """Offsets before this were cleaned: their keys are unique among them."""
    tombstone_expiry_ms: int | None
    """When the earliest tombstone the last cleaning kept may go (``None``: it kept none)."""


@dataclass
class TaskRecord:
    """The persisted state of one run of compaction tasks."""

    run_id: str
    tasks: list[CompactionTask]
    streams: list[TaskStream]
    state: SagaState = SagaState.PLANNED
    files: list[WrittenFile] | None = None
    sequences: dict[str, int] | None = None
    created_ms: int = 0
    kind: TaskKind = TaskKind.COMPACT
    version: int = MUST_NOT_EXIST
    term: int = 0
    """The term of the leader that wrote the record last (:mod:`.leadership`)."""
    failures: int = 0
    """Tries in a row that failed."""
    error: str | None = None
    """What the last failure said."""
    retry_after_ms: int = 0
    """Set aside until then (module docstring); 0: not set aside."""
    suffix: str = ""
    """A part split off a run (one topic's): its key is the run's with this after it."""

    def set_aside(self, now_ms: int) -> bool:
        """Whether the run waits to be tried again (``icefloe tables retry`` ends the wait)."""
        return now_ms < self.retry_after_ms

    @property
    def key(self) -> str:
        return TASKS + f"{self.created_ms:015d}-{self.run_id}{self.suffix}"

    @property
    def topics(self) -> list[str]:
        return sorted({s.topic for s in self.streams})

    @property
    def ranges(self) -> list[StreamRange]:
        """Every range the run's tasks read."""
        return [r for task in self.tasks for r in task.ranges]

    def encode(self) -> bytes:
        payload = {
            "run": self.run_id,
            "tasks": [_encode_task(task) for task in self.tasks],
            "streams": [
                [s.topic, s.partition, s.stream_id, s.replaced, s.retired] for s in self.streams
            ],
            "state": str(self.state),
            "files": [asdict(f) for f in self.files] if self.files is not None else None,
            "sequences": self.sequences,
            "created_ms": self.created_ms,
            "kind": str(self.kind),
            "term": self.term,
            "failures": self.failures,
            "error": self.error,
            "retry_after_ms": self.retry_after_ms,
            "suffix": self.suffix,
        }
        return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, record: Record) -> TaskRecord:
        p = msgpack.unpackb(record.value, raw=False)
        # Records written before runs held several tasks have one, under "task".
        tasks = [_decode_task(t) for t in p["tasks"]] if "tasks" in p else [_decode_task(p["task"])]
        files = None
        if p["files"] is not None:
            files = [
                WrittenFile(**{**f, "row_groups": tuple(tuple(g) for g in f["row_groups"])})
                for f in p["files"]
            ]
        return cls(
            p.get("run", tasks[0].task_id),
            tasks,
            [
                TaskStream(t, pa, s, list(ks), *map(list, rest))
                for t, pa, s, ks, *rest in p["streams"]
            ],
            SagaState(p["state"]),
            files,
            p["sequences"],
            p["created_ms"],
            TaskKind(p.get("kind", TaskKind.COMPACT)),
            record.version,
            # Absent in records written before runs were fenced and set aside.
            int(p.get("term", 0)),
            int(p.get("failures", 0)),
            p.get("error"),
            int(p.get("retry_after_ms", 0)),
            str(p.get("suffix", "")),
        )


def _encode_task(task: CompactionTask) -> list[Any]:
    return [
        task.task_id,
        [_range_fields(r) for r in task.ranges],
        [list(p) for p in task.output_paths],
        [[s, str(unit)] for s, unit in task.time_partitions],
        [[s, *astuple(spec)] for s, spec in task.cleaning],
        [list(a) for a in task.aborted],
        [[s, topic, list(sides)] for s, topic, sides in task.typed],
        [[s, codec] for s, codec in task.codecs],
    ]


def _range_fields(r: StreamRange) -> dict[str, Any]:
    # What dataclasses.asdict gives, built directly: a run's record lists thousands of ranges
    # and is written at each step of the saga, and asdict costs several times more.
    return {
        "stream_id": r.stream_id,
        "partition": r.partition,
        "start_offset": r.start_offset,
        "end_offset": r.end_offset,
        "ref": r.ref,
        "byte_start": r.byte_start,
        "byte_end": r.byte_end,
        "source": r.source,
    }


def _decode_task(fields: list[Any]) -> CompactionTask:
    # Time partitions, cleaning specs, aborted transactions, typed sides, codecs: absent in
    # older records.
    task_id, ranges, outputs, *rest = fields
    return CompactionTask(
        task_id,
        tuple(_stream_range(r) for r in ranges),
        tuple((int(s), str(k)) for s, k in outputs),
        tuple((int(s), TimePartition(unit)) for s, unit in (rest[0] if rest else ())),
        tuple((int(s), CleanSpec(*fields)) for s, *fields in (rest[1] if rest[1:] else ())),
        tuple(_aborted(a) for a in (rest[2] if rest[2:] else ())),
        tuple(
            (int(s), str(topic), tuple(map(str, sides)))
            for s, topic, sides in (rest[3] if rest[3:] else ())
        ),
        tuple((int(s), str(codec)) for s, codec in (rest[4] if rest[4:] else ())),
    )


def _aborted(fields: list[int]) -> tuple[int, int, int, int]:
    stream_id, producer_id, first_offset, marker_offset = (int(f) for f in fields)
    return stream_id, producer_id, first_offset, marker_offset


def _stream_range(fields: dict[str, Any]) -> StreamRange:
    """A stored range; records written before Parquet sources existed name the ref
    ``wal_ref``."""
    fields = dict(fields)
    if "wal_ref" in fields:
        fields["ref"] = fields.pop("wal_ref")
    fields["source"] = Source(fields.get("source", Source.WAL))
    return StreamRange(**fields)


class Committer:
    """Runs tasks through the saga; only the compaction leader uses one."""

    def __init__(
        self,
        metadata: MetadataStore,
        offsets: OffsetIndex,
        store: ObjectStore,
        engine: CompactionEngine,
        table_formats: Mapping[str, TableFormat],
        table_spec: Callable[[str], TableSpec],
        *,
        expire_every: int,
        history_ms: Callable[[str], int],
        is_live: Callable[[str, int], bool],
        set_aside_retry_s: float = 600.0,
    ) -> None:
        self._metadata = metadata
        self._offsets = offsets
        self._store = store
        self._engine = engine
        self._table_formats = dict(table_formats)
        """Each enabled format by its backend name."""
        self._table_spec = table_spec
        """A topic's table, by topic name."""
        self._expire_every = expire_every
        self._history_ms = history_ms
        """How long a topic's table history (and its retired files) is kept."""
        self._is_live = is_live
        """Whether a stream (by topic name and stream id) is a partition of a live topic, not
        of a deleted one, nor of an older topic of the same name."""
        self._ensured: set[tuple[int, str]] = set()
        self._committing = asyncio.Lock()
        """Held from a run's sequence allocation to its last table commit (module docstring)."""
        self._set_aside_retry_ms = int(set_aside_retry_s * 1000)
        self.lease: Lease = UNLEADED
        """The leadership this committer acts under; each saga step checks it first."""

    async def unfinished(self) -> list[TaskRecord]:
        """Runs a previous leader started and did not finish: those past ``planned`` first
        (their sequences are older than any a planned run will take), then oldest first."""
        records = [r async for r in self._metadata.scan_all(TASKS, prefix_end(TASKS))]
        decoded = [TaskRecord.decode(r) for r in records]
        return sorted(decoded, key=lambda r: r.state is SagaState.PLANNED)

    async def start(self, plan: Plan) -> TaskRecord:
        """Persist a new run in state ``planned``."""
        record = TaskRecord(
            plan.run_id,
            list(plan.tasks),
            [
                TaskStream(
                    s.topic,
                    s.partition,
                    s.stream_id,
                    [_entry_key(e) for e in s.entries],
                    _retired_files(plan.kind, s.entries),
                )
                for s in plan.streams
            ],
            created_ms=int(time.time() * 1000),
            kind=plan.kind,
        )
        await self._save(record)
        return record

    async def finish(self, record: TaskRecord) -> TaskRecord:
        """Take a run from whatever state it is in to the end of the saga."""
        files = None
        if record.state is SagaState.PLANNED:
            tasks = [task for task in record.tasks if task.ranges]
            files = await self._engine.run(tasks) if tasks else []
        async with self._committing:
            if record.state is SagaState.PLANNED:
                assert files is not None
                record.files = files
                changed = {f.stream_id for f in files if f.record_count} | {
                    s.stream_id for s in record.streams if s.retired
                }
                record.sequences = {
                    topic: await counters.increment(self._metadata, f"table-sequence/{topic}")
                    for topic in sorted({s.topic for s in record.streams if s.stream_id in changed})
                }
                record.state = SagaState.WRITTEN
                await self._save(record)
            if record.state is SagaState.WRITTEN:
                try:
                    await self._commit_tables(record)
                except TopicsFailedError as failed:
                    if len(failed.failures) == len(record.sequences or ()):
                        raise
                    # The other topics are in their tables: they go on without these.
                    await self._split_off(record, failed)
                record.state = SagaState.COMMITTED
                await self._save(record)
        if record.state is SagaState.COMMITTED:
            for stream in record.streams:
                self.lease.check()
                if not self._is_live(stream.topic, stream.stream_id):
                    await self._discard(record, stream)
                elif record.kind is TaskKind.EXPIRE:
                    await self._remove_entries(stream)
                elif record.kind is TaskKind.CLEAN:
                    await self._swap_cleaned(record, stream)
                else:
                    await self._swap(record, stream)
            await self._retire(record)
            self.lease.check()
            # Only the version this leader wrote: one a newer leader claimed is its to finish.
            await self._metadata.delete(record.key, expected_version=record.version)
            record.state = SagaState.SWAPPED
        return record

    async def claim(self, record: TaskRecord) -> TaskRecord:
        """Make an unfinished run this leader's: its term in the record, by compare-and-set,
        so that a step the leader that wrote it last still has under way fails on the
        record's version. What that leader did already is done again or skipped: a task
        writes the same files, a table skips a sequence it has.

        Raises:
            ConflictError: the record changed since it was read.
        """
        if record.term != self.lease.term:
            term = record.term
            await self._save(record)
            log.info("run %s of the leader of term %d taken over", record.run_id, term)
        return record

    async def note_failure(self, record: TaskRecord, error: BaseException) -> TaskRecord | None:
        """Count a failed try of ``record`` in its stored record, setting it aside after
        :data:`SET_ASIDE_AFTER` in a row (never for a failure that passes by itself); the
        record as stored now (``None``: gone, finished or split up meanwhile, or taken over by
        another leader)."""
        current = await self._metadata.get(record.key)
        if current is None:
            return None
        stored = TaskRecord.decode(current)
        if stored.term != self.lease.term:
            # Another leader took the run over (which is what made this try fail): it is
            # that leader's now, and written in this term it would be taken back from it.
            return None
        stored.failures += 1
        stored.error = _one_line(error)
        if stored.failures >= SET_ASIDE_AFTER and not _passing(error):
            factor = min(2 ** (stored.failures - SET_ASIDE_AFTER), MAX_SET_ASIDE_FACTOR)
            delay_ms = self._set_aside_retry_ms * factor
            stored.retry_after_ms = int(time.time() * 1000) + delay_ms
        await self._save(stored)
        return stored

    async def retry_set_aside(self) -> list[TaskRecord]:
        """End the wait of every set-aside run: the leader's next round tries each again (one
        more failure sets it aside again). Returns the runs."""
        now_ms = int(time.time() * 1000)
        retried = []
        for record in await self.unfinished():
            if record.set_aside(now_ms):
                record.retry_after_ms = 0
                record.failures = min(record.failures, SET_ASIDE_AFTER - 1)
                written = await self._metadata.put(
                    record.key, record.encode(), expected_version=record.version
                )
                record.version = written.version
                retried.append(record)
        return retried

    async def _split_off(self, record: TaskRecord, failed: TopicsFailedError) -> None:
        """Make the failed topics of ``record`` runs of their own and take them out of it.
        Each part is written before the run drops it, under a key of its own topic: a crash
        in between leaves a part that the run's next try writes again, or finds there."""
        assert record.sequences is not None
        for topic, error in sorted(failed.failures.items()):
            part = _part_of(record, topic)
            part.failures = record.failures + 1
            part.error = f"topic {topic!r}: {_one_line(error)}"
            with contextlib.suppress(AlreadyExistsError):  # written by an earlier try
                await self._save(part)
            log.warning(
                "run %s: topic %s split off as run %s%s after: %s",
                record.run_id,
                topic,
                part.run_id,
                part.suffix,
                part.error,
            )
        kept = [s for s in record.streams if s.topic not in failed.failures]
        kept_ids = {s.stream_id for s in kept}
        record.streams = kept
        record.tasks = [t for t in (_task_of(t, kept_ids) for t in record.tasks) if t.ranges]
        record.files = [f for f in record.files or () if f.stream_id in kept_ids]
        record.sequences = {t: n for t, n in record.sequences.items() if t not in failed.failures}

    def forget_tables(self) -> None:
        """Check each table exists again before its next commit: another leader may have
        dropped some since (a deleted topic's)."""
        self._ensured.clear()

    async def delete_retired(self, now_ms: int) -> list[str]:
        """Delete the retired data files whose grace period is over; return their keys."""
        deleted: list[str] = []
        async for record in self._metadata.scan_all(RETIRED, prefix_end(RETIRED)):
            delete_after_ms, files = msgpack.unpackb(record.value, raw=False)
            if delete_after_ms > now_ms:
                continue
            for key in files:
                await self._store.delete(key)
            await self._metadata.delete(record.key)
            deleted.extend(files)
        return deleted

    async def retired(self) -> set[str]:
        """Object keys of retired data files not deleted yet."""
        keys_: set[str] = set()
        async for record in self._metadata.scan_all(RETIRED, prefix_end(RETIRED)):
            keys_.update(msgpack.unpackb(record.value, raw=False)[1])
        return keys_

    # --- steps ------------------------------------------------------------------------------

    async def _commit_tables(self, record: TaskRecord) -> None:
        """Commit the run's files to every enabled format, a topic at a time; the topics that
        fail are raised together (:class:`TopicsFailedError`) once the others are done."""
        assert record.files is not None
        assert record.sequences is not None
        added: dict[str, list[DataFile]] = {topic: [] for topic in record.sequences}
        removed: dict[str, list[str]] = {topic: [] for topic in record.sequences}
        dead: dict[str, list[DataFile]] = {topic: [] for topic in record.sequences}
        stream_of = {s.stream_id: s for s in record.streams}
        now_ms = int(time.time() * 1000)
        for f in record.files:
            stream = stream_of[f.stream_id]
            if not f.record_count:
                continue  # the index's alone (module docstring)
            added[stream.topic].append(
                DataFile(
                    layout.relative_path(stream.topic, f.path),
                    f.size,
                    f.record_count,
                    stream.partition,
                    now_ms,
                    f.time_bucket,
                )
            )
            if f.dead_letter_path is not None:
                path = layout.dead_letter_relative_path(stream.topic, f.dead_letter_path)
                dead[stream.topic].append(
                    DataFile(path, f.dead_letter_size, f.dead_letters, stream.partition, now_ms)
                )
        for stream in record.streams:
            if stream.topic in removed:
                removed[stream.topic].extend(
                    layout.relative_path(stream.topic, key) for key in stream.retired
                )
        # A deleted topic's tables are dropped, not committed to; nor may an old topic's files
        # reach the tables of a new topic of the same name.
        gone = {s.topic for s in record.streams if not self._is_live(s.topic, s.stream_id)}
        failures: dict[str, BaseException] = {}
        for topic in sorted(t for t in record.sequences if t not in gone):
            try:
                await self._commit_topic(record, topic, added[topic], removed[topic], dead[topic])
            except LeadershipLostError:
                raise
            except Exception as exc:  # noqa: BLE001 - a format SDK's own errors too
                log.warning("run %s: topic %s not committed: %s", record.run_id, topic, exc)
                failures[topic] = exc
        if failures:
            raise TopicsFailedError(failures)

    async def _commit_topic(
        self,
        record: TaskRecord,
        topic: str,
        added: list[DataFile],
        removed: list[str],
        dead: list[DataFile],
    ) -> None:
        """Commit one topic's files of the run to every enabled format. A run that failed
        before may have been overtaken meanwhile: a format that holds its files has it, and
        a sequence that a later run passed is taken anew."""
        assert record.sequences is not None
        spec = self.table_spec(topic)
        now_ms = int(time.time() * 1000)
        for format_name, table_format in self._table_formats.items():
            self.lease.check()
            if (id(table_format), topic) not in self._ensured:
                await table_format.ensure_table(spec)
                self._ensured.add((id(table_format), topic))
            sequence = record.sequences[topic]
            taken = removed
            if record.failures:
                if await _holds(table_format, spec, added, removed):
                    continue
                if sequence <= await table_format.last_commit(spec):
                    sequence = await self._resequence(record, topic)
            if taken and sequence > await table_format.last_commit(spec):
                # A file the table never had (tables enabled after it was written) is
                # not the table's to remove; every format refuses such a commit.
                live = {f.path for f in await table_format.files(spec)}
                taken = [path for path in taken if path in live]
            with metrics.timed(
                metrics.TABLE_COMMIT_SECONDS.labels(format_name),
                metrics.TABLE_COMMIT_FAILURES.labels(format_name),
            ):
                await table_format.commit(spec, sequence, added, taken)
            if dead:
                # The topic's dead-letter table, under the same sequence (each table skips
                # a sequence it has; this one only gets those with dead letters).
                letters = layout.dead_letter_spec(self._store, spec, topic)
                if (id(table_format), f"dead-letters:{topic}") not in self._ensured:
                    await table_format.ensure_table(letters)
                    self._ensured.add((id(table_format), f"dead-letters:{topic}"))
                if not (record.failures and await _holds(table_format, letters, dead, [])):
                    await table_format.commit(letters, sequence, dead)
            if sequence % self._expire_every == 0:
                await table_format.expire(spec, now_ms - self._history_ms(topic))

    async def _resequence(self, record: TaskRecord, topic: str) -> int:
        """Give ``topic``'s part of the run a new sequence, recorded before any format gets
        it, and return it."""
        assert record.sequences is not None
        record.sequences[topic] = await counters.increment(
            self._metadata, f"table-sequence/{topic}"
        )
        await self._save(record)
        sequence = record.sequences[topic]
        log.info("run %s: topic %s takes sequence %d", record.run_id, topic, sequence)
        return sequence

    async def _swap(self, record: TaskRecord, stream: TaskStream) -> None:
        assert record.files is not None
        files = sorted(
            (f for f in record.files if f.stream_id == stream.stream_id),
            key=lambda f: f.start_offset,
        )
        pieces = [
            NewPiece(
                ParquetLocation(f.path, f.size, f.row_groups),
                f.start_offset,
                f.end_offset,
                f.min_timestamp,
                f.max_timestamp,
            )
            for f in files
        ]
        if not await self._offsets.swap(stream.replaced, pieces):
            log.warning(
                "stream %d changed under compaction (topic deleted?); skipping", stream.stream_id
            )

    async def _swap_cleaned(self, record: TaskRecord, stream: TaskStream) -> None:
        """The index step of log compaction: each new file replaces the entries of its
        offsets (one, or a run whose earlier files kept nothing), so each keeps the time its
        records were written; then the stream's cleaned end is recorded."""
        files = sorted(
            (f for f in record.files or () if f.stream_id == stream.stream_id),
            key=lambda f: f.start_offset,
        )
        ends = [keys.parse_index_key(key)[1] for key in stream.replaced]
        for f in files:
            group = [
                k
                for k, end in zip(stream.replaced, ends, strict=True)
                if f.start_offset < end <= f.end_offset
            ]
            piece = NewPiece(
                ParquetLocation(f.path, f.size, f.row_groups),
                f.start_offset,
                f.end_offset,
                f.min_timestamp,
                f.max_timestamp,
            )
            if not group or not await self._offsets.swap(group, [piece]):
                log.warning("stream %d changed under log compaction; skipping", stream.stream_id)
                return
        expiries = [f.tombstone_expiry_ms for f in files if f.tombstone_expiry_ms is not None]
        cleaned = Cleaned(ends[-1], min(expiries, default=None))
        await self._metadata.put(_cleaned_key(stream.stream_id), msgpack.packb(astuple(cleaned)))

    async def cleaned(self, stream_id: int) -> Cleaned | None:
        """How far log compaction has cleaned ``stream_id`` (``None``: never, or unreadable)."""
        record = await self._metadata.get(_cleaned_key(stream_id))
        if record is None:
            return None
        try:
            end, expiry = msgpack.unpackb(record.value, raw=False)
            return Cleaned(int(end), None if expiry is None else int(expiry))
        except (ValueError, TypeError, msgpack.UnpackException):
            log.warning("ignoring the unreadable log-compaction record of stream %d", stream_id)
            return None  # cleaned again from scratch: harmless

    async def forget_cleaned(self, stream_ids: Sequence[int]) -> None:
        """Delete the log-compaction records of deleted streams."""
        for stream_id in stream_ids:
            await self._metadata.delete(_cleaned_key(stream_id))

    async def _discard(self, record: TaskRecord, stream: TaskStream) -> None:
        """The index step for a stream of a deleted topic: the files the task wrote for it
        are nobody's."""
        for f in record.files or ():
            if f.stream_id == stream.stream_id:
                await self._store.delete(f.path)
                if f.dead_letter_path is not None:
                    await self._store.delete(f.dead_letter_path)

    async def _remove_entries(self, stream: TaskStream) -> None:
        """The expiry's index step: the entries still there leave the front of the stream."""
        entries = []
        for key in stream.replaced:
            current = await self._metadata.get(key)
            if current is not None:
                entries.append(index.decode(current.key, current.value))
        await self._offsets.expire(stream.stream_id, entries)

    async def _retire(self, record: TaskRecord) -> None:
        """Record the task's retired files for deletion after the longest grace period of
        their topics (idempotent: a replay rewrites the same record)."""
        files: list[str] = []
        for stream in record.streams:
            if stream.retired:
                # Defence in depth: a file the index still references is never deleted.
                still = {
                    e.location.key
                    async for e in self._offsets.entries(stream.stream_id)
                    if isinstance(e.location, ParquetLocation)
                }
                files.extend(key for key in stream.retired if key not in still)
        if not files:
            return
        grace_ms = max(max(self._history_ms(s.topic), MIN_RETIRED_GRACE_MS) for s in record.streams)
        value = msgpack.packb([int(time.time() * 1000) + grace_ms, files], use_bin_type=True)
        await self._metadata.put(RETIRED + record.key.removeprefix(TASKS), value)

    async def _save(self, record: TaskRecord) -> None:
        """Write ``record`` in this leader's term, if it is still the version last read: a
        leader that lost its lease, or whose record a newer leader claimed, fails here."""
        self.lease.check()
        record.term = self.lease.term
        written = await self._metadata.put(
            record.key, record.encode(), expected_version=record.version
        )
        record.version = written.version

    def table_spec(self, topic: str) -> TableSpec:
        """The table of ``topic`` in this cluster's object store."""
        return self._table_spec(topic)


async def _holds(
    table_format: TableFormat, spec: TableSpec, added: list[DataFile], removed: list[str]
) -> bool:
    """Whether the table has a commit of these files already: it holds every added file and
    none of the removed ones."""
    live = {f.path for f in await table_format.files(spec)}
    return all(f.path in live for f in added) and not any(path in live for path in removed)


def _part_of(record: TaskRecord, topic: str) -> TaskRecord:
    """``topic``'s part of a written run, as a run of its own."""
    assert record.sequences is not None
    streams = [s for s in record.streams if s.topic == topic]
    ids = {s.stream_id for s in streams}
    return TaskRecord(
        record.run_id,
        [t for t in (_task_of(t, ids) for t in record.tasks) if t.ranges],
        streams,
        record.state,
        [f for f in record.files or () if f.stream_id in ids],
        {topic: record.sequences[topic]},
        record.created_ms,
        record.kind,
        suffix=record.suffix + "." + hashlib.sha256(topic.encode()).hexdigest()[:12],
    )


def _task_of(task: CompactionTask, stream_ids: set[int]) -> CompactionTask:
    """``task`` cut down to the streams ``stream_ids``."""

    def mine(pairs: tuple[tuple[Any, ...], ...]) -> tuple[Any, ...]:
        return tuple(p for p in pairs if p[0] in stream_ids)

    return dataclasses.replace(
        task,
        ranges=tuple(r for r in task.ranges if r.stream_id in stream_ids),
        output_paths=mine(task.output_paths),
        time_partitions=mine(task.time_partitions),
        cleaning=mine(task.cleaning),
        aborted=mine(task.aborted),
        typed=mine(task.typed),
        codecs=mine(task.codecs),
    )


def _one_line(error: BaseException) -> str:
    """The first line of what ``error`` says, with its type, bounded."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:ERROR_CHARS]


def _retired_files(kind: TaskKind, entries: Sequence[IndexEntry]) -> list[str]:
    """The data files a task of ``kind`` over ``entries`` takes out of the tables."""
    if kind is TaskKind.COMPACT:
        return []
    return [e.location.key for e in entries if isinstance(e.location, ParquetLocation)]


def _cleaned_key(stream_id: int) -> str:
    return CLEANED + f"{stream_id:012d}"


def _entry_key(entry: IndexEntry) -> str:
    return keys.index_key(entry.stream_id, entry.end, entry.cumulative_size)


def describe(record: TaskRecord) -> dict[str, Any]:
    """A summary of a run for logs and progress output."""
    return {
        "run": record.run_id,
        "tasks": len(record.tasks),
        "state": record.state,
        "streams": len(record.streams),
        "kind": record.kind,
        "sources": len({r.ref for r in record.ranges}),
        "files": len(record.files or ()),
        "term": record.term,
        "failures": record.failures,
    }
