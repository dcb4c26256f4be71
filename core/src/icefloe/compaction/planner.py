"""Choosing what to compact: per stream, a run of WAL entries from the start of its WAL part.

A stream's index is some Parquet entries (compacted) followed by WAL entries. A stream is due
when its WAL part holds ``min_bytes`` or its oldest WAL entry is ``max_age_s`` old (topic configs
may override both); then its WAL entries older than ``min_age_s`` are taken, oldest first.
Streams are packed into one task up to ``max_task_bytes``, and a WAL object that several
chosen streams share is read once.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from icefloe.config.compactor import CompactorOptions
from icefloe.ports.compaction import CompactionTask, Source, StreamRange, data_file_name
from icefloe.ports.table import TimePartition
from icefloe.storage.index import IndexEntry, WalLocation
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.transactions import TransactionMarks
from icefloe.tables import layout
from icefloe.topics.configs import MAX_AGE_CONFIG, MIN_BYTES_CONFIG, time_partition
from icefloe.topics.registry import Topic


@dataclass(frozen=True, slots=True)
class StreamPlan:
    """One stream's share of a task: the index entries it replaces."""

    topic: str
    partition: int
    stream_id: int
    entries: tuple[IndexEntry, ...]

    @property
    def start(self) -> int:
        return self.entries[0].start

    @property
    def end(self) -> int:
        return self.entries[-1].end

    @property
    def output_path(self) -> str:
        """The data file the stream's entries become (named by their offsets)."""
        name = data_file_name(self.stream_id, self.start, self.end)
        return layout.data_file(self.topic, self.partition, name)


class TaskKind(enum.StrEnum):
    """What a task does to the streams it names."""

    COMPACT = "compact"
    """WAL entries become one data file per stream, added to the tables."""
    REWRITE = "rewrite"
    """Consecutive small data files of a stream become one (table maintenance); the tables
    swap them for it."""
    EXPIRE = "expire"
    """Entries past retention leave the index, and their data files leave the tables."""
    CLEAN = "clean"
    """Log compaction (``cleanup.policy=compact``): a stream's data files are each rewritten
    without the records a later record of the same key replaced; the tables and the index
    swap them for the new files."""


@dataclass(frozen=True, slots=True)
class Plan:
    task: CompactionTask
    streams: tuple[StreamPlan, ...]
    kind: TaskKind = TaskKind.COMPACT


async def plan_task(
    index: IndexReader,
    topics: Sequence[Topic],
    options: CompactorOptions,
    now_ms: int,
    *,
    force: bool = False,
    transactions: TransactionMarks | None = None,
) -> Plan | None:
    """The next task, or ``None`` when nothing is due. ``force`` ignores ages and sizes.

    With ``transactions``, a stream is compacted only up to its last stable offset (records
    of open transactions stay in the WAL until they are decided), and the task learns which
    transactions in its ranges were aborted, to leave them out.
    """
    budget = options.max_task_bytes
    chosen: list[StreamPlan] = []
    aborted: list[tuple[int, int, int, int]] = []
    units = {t.name: unit for t in topics if (unit := time_partition(t.configs)) is not None}
    for topic in topics:
        for partition, stream_id in enumerate(topic.streams):
            wal_entries = [e async for e in index.entries(stream_id) if e.in_wal]
            entries = _due(wal_entries, topic, options, now_ms, force, budget)
            if entries and transactions is not None:
                entries = await _stable(transactions, stream_id, entries, aborted)
            if entries:
                chosen.append(StreamPlan(topic.name, partition, stream_id, tuple(entries)))
                budget -= sum(e.size for e in entries)
            if budget <= 0:
                return plan_of(chosen, units, TaskKind.COMPACT, aborted)
    return plan_of(chosen, units, TaskKind.COMPACT, aborted) if chosen else None


async def _stable(
    transactions: TransactionMarks,
    stream_id: int,
    entries: list[IndexEntry],
    aborted: list[tuple[int, int, int, int]],
) -> list[IndexEntry]:
    """``entries`` up to the stream's last stable offset (read from the store, not a cache:
    a record of an open transaction must never reach a table); adds to ``aborted`` the
    aborted transactions they hold."""
    marks = await transactions.stored_open_marks(stream_id)
    stable = min((m.first_offset for m in marks), default=entries[-1].end)
    entries = [e for e in entries if e.end <= stable]
    if entries:
        found = await transactions.aborted(stream_id, entries[0].start, entries[-1].end)
        aborted += [(stream_id, a.producer_id, a.first_offset, a.marker_offset) for a in found]
    return entries


def _due(
    entries: list[IndexEntry],
    topic: Topic,
    options: CompactorOptions,
    now_ms: int,
    force: bool,
    budget: int,
) -> list[IndexEntry]:
    if not entries:
        return []
    max_age_ms = int(topic.configs.get(MAX_AGE_CONFIG, options.max_age_s * 1000))
    min_bytes = int(topic.configs.get(MIN_BYTES_CONFIG, options.min_bytes))
    waiting = sum(e.size for e in entries)
    if not force and waiting < min_bytes and now_ms - entries[0].created_ms < max_age_ms:
        return []
    taken: list[IndexEntry] = []
    for entry in entries:
        if not force and now_ms - entry.created_ms < options.min_age_s * 1000:
            break
        if taken and (budget <= 0 or entry.start != taken[-1].end):
            break
        taken.append(entry)
        budget -= entry.size
    return taken


def plan_of(
    streams: Sequence[StreamPlan],
    units: Mapping[str, TimePartition],
    kind: TaskKind,
    aborted: Sequence[tuple[int, int, int, int]] = (),
) -> Plan:
    """The task reading every entry of ``streams`` (WAL chunks or whole data files) into one
    file per stream, split by time for the topics in ``units``, leaving out ``aborted``
    transactions (see :attr:`CompactionTask.aborted`)."""
    ranges = tuple(source_range(s, entry) for s in streams for entry in s.entries)
    outputs = tuple((s.stream_id, s.output_path) for s in streams)
    split = tuple((s.stream_id, units[s.topic]) for s in streams if s.topic in units)
    task = CompactionTask(uuid.uuid4().hex, ranges, outputs, split, aborted=tuple(aborted))
    return Plan(task, tuple(streams), kind)


def source_range(stream: StreamPlan, entry: IndexEntry) -> StreamRange:
    """Where a task reads ``entry``: its chunk of a WAL object, or its whole data file."""
    location = entry.location
    if isinstance(location, WalLocation):
        end = location.position + location.length
        source = (location.ref, location.position, end, Source.WAL)
    else:
        source = (location.key, 0, location.size, Source.PARQUET)
    return StreamRange(stream.stream_id, stream.partition, entry.start, entry.end, *source)
