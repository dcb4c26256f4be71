"""Choosing what to compact: per stream, a run of WAL entries from the start of its WAL part.

A stream's index is some Parquet entries (compacted) followed by WAL entries. A stream is due
when its WAL part holds ``min_bytes`` or its oldest WAL entry is ``max_age_s`` old (topic configs
may override both); then its WAL entries older than ``min_age_s`` are taken, oldest first.
Streams are packed into one *run* of up to ``max_tasks_per_run`` tasks of about
``max_task_bytes`` each (:func:`split_by_objects`): the tasks partition the run's WAL objects,
so each object is still read once, and each stream's share of a task is one contiguous offset
range, written as one data file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import logging
import math
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from icefloe.config.compactor import CompactorOptions
from icefloe.ports.compaction import CompactionTask, Source, StreamRange, data_file_name
from icefloe.ports.table import TimePartition
from icefloe.quiet_log import QuietLog
from icefloe.storage.index import IndexEntry, WalLocation
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.parquet import DEFAULT_CODEC
from icefloe.storage.transactions import TransactionMarks
from icefloe.tables import layout
from icefloe.topics.configs import (
    MAX_AGE_CONFIG,
    MIN_BYTES_CONFIG,
    table_codec,
    time_partition,
    typed_sides,
)
from icefloe.topics.registry import Topic

RUN_RECORD_BYTES: Final = 768 << 10
"""What one run's saga record may hold: it lists every index entry the run replaces, the range
each task reads for it, and every file written, and must stay inside a metadata value (1 MiB)
at each step of the saga. A run is planned against this estimate of the record's size, so a
stream far behind, whose WAL holds many small entries (the latency profile's), is compacted
in few runs: each run costs a commit to every table format, whatever its size. The split
into tasks adds at most a file per task to the estimate, well inside the rest of the value."""
ENTRY_RECORD_BYTES: Final = 200
"""What an entry adds to the record besides its WAL object's name: its key among those the
run replaces (about 70 bytes) and its range in a task (about 120 with the field names)."""
FILE_RECORD_BYTES: Final = 400
"""What a written file adds besides its path: its description, row groups and output key."""
STREAM_RECORD_BYTES: Final = 200 + FILE_RECORD_BYTES
"""What a stream adds besides its topic name, which it repeats (:func:`stream_record_bytes`)."""

FUTURE_STAMP_TOLERANCE_MS: Final = 1000
"""How far past this process's clock an entry's stamp may be and still be taken as written
now: host clocks kept by NTP agree far better than this."""

_clock_log = QuietLog(logging.getLogger(__name__), every_s=60)


def waited_ms(now_ms: int, created_ms: int) -> float:
    """How long ago, by this process's clock, an entry stamped ``created_ms`` was written.

    The stamp is the writing broker's wall clock. One further ahead than the tolerance comes
    from a broker whose clock is wrong, and counts as long ago: waiting for that clock would
    hold the stream's tables back for as long as the clock is off (minutes, or days), while
    the ages only decide how soon a stream is compacted, never what a run may take.
    """
    waited = now_ms - created_ms
    if waited >= -FUTURE_STAMP_TOLERANCE_MS:
        return waited
    _clock_log.warning(
        "WAL entries stamped more than a second ahead of this host's clock: the clock of a "
        "broker that writes them is off (check its time sync); compacted without waiting"
    )
    return math.inf


@dataclass(slots=True)
class StreamBacklog:
    """A stream's index past its leading entries in tables, summed up as far as read: enough
    to tell whether the stream is due without reading its WAL entries again every round."""

    tables_end: int = 0
    """Where the leading entries in tables end (WAL entries always follow them)."""
    read_end: int = 0
    """Where the last entry read ends: the next round reads only what comes after."""
    records: int = 0
    size: int = 0
    """Records and bytes of the WAL entries read."""
    oldest_ms: int | None = None
    """When the first WAL entry was written (``None``: none read yet)."""

    def add(self, entry: IndexEntry) -> bool:
        """Take in the next entry; ``False`` if it cannot follow what was read (an entry in
        tables after WAL entries: the index changed under this summary)."""
        if entry.in_wal:
            self.records += entry.record_count
            self.size += entry.size
            if self.oldest_ms is None:
                self.oldest_ms = entry.created_ms
        elif self.oldest_ms is not None:
            return False
        else:
            self.tables_end = entry.end
        self.read_end = entry.end
        return True


async def backlog_after_run(
    index: IndexReader, backlog: StreamBacklog, compacted: Sequence[IndexEntry]
) -> StreamBacklog | None:
    """``backlog`` without the WAL entries a finished run ``compacted`` (now in tables), or
    ``None`` when they were not the leading WAL entries it summed up (read the stream again).
    Reads one entry, the next WAL one, for its age: a stream far behind is not read again
    whole after each of its runs."""
    if not compacted or compacted[0].start != backlog.tables_end:
        return None
    end = compacted[-1].end
    if end > backlog.read_end:
        return None
    records = backlog.records - sum(e.record_count for e in compacted)
    size = backlog.size - sum(e.size for e in compacted)
    oldest_ms = None
    if end < backlog.read_end:
        following = index.entries(stream_id=compacted[0].stream_id, after_end=end)
        async with contextlib.aclosing(following):
            async for entry in following:
                if not entry.in_wal:
                    return None
                oldest_ms = entry.created_ms
                break
    return StreamBacklog(end, backlog.read_end, records, size, oldest_ms)


async def read_backlog(
    index: IndexReader, stream_id: int, backlogs: dict[int, StreamBacklog] | None
) -> StreamBacklog:
    """The stream's backlog, brought up to date by reading only the entries after what
    ``backlogs`` (kept across calls, may be ``None``) last read of it: none at all while the
    index's notifications tell of no entry ending later (one written meanwhile is then read
    by the round after its notification)."""
    known = None if backlogs is None else backlogs.get(stream_id)
    if known is not None:
        end = index.log_end_hint(stream_id)
        if end is not None and end <= known.read_end:
            return known
    backlog = StreamBacklog() if known is None else known
    async for entry in index.entries(stream_id, after_end=backlog.read_end):
        if not backlog.add(entry):
            backlog = StreamBacklog()  # read again from the start
            async for again in index.entries(stream_id):
                if not backlog.add(again):
                    break  # changed once more: the next round sees it
            break
    if backlogs is not None:
        backlogs[stream_id] = backlog
        index.saw_end(stream_id, backlog.read_end)
    return backlog


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
    """One run of the saga: its tasks (run by the engine together, committed together) and
    the streams whose entries they replace."""

    tasks: tuple[CompactionTask, ...]
    streams: tuple[StreamPlan, ...]
    kind: TaskKind = TaskKind.COMPACT

    @property
    def run_id(self) -> str:
        """Names the run's saga record (its first task's id)."""
        return self.tasks[0].task_id


async def plan_task(
    index: IndexReader,
    topics: Sequence[Topic],
    options: CompactorOptions,
    now_ms: int,
    *,
    force: bool = False,
    transactions: TransactionMarks | None = None,
    busy: frozenset[int] = frozenset(),
    backlogs: dict[int, StreamBacklog] | None = None,
) -> Plan | None:
    """The next run, or ``None`` when nothing is due. ``force`` ignores ages and sizes.
    ``busy`` streams (in a run not finished yet) are left out.

    ``backlogs`` keeps, across calls, what each stream's index holds past its entries in
    tables (:class:`StreamBacklog`): a round reads only the entries written since the last,
    and a stream's WAL entries once it is due. The caller drops a stream's backlog when a
    run changes its entries.

    With ``transactions``, a stream is compacted only up to its last stable offset (records
    of open transactions stay in the WAL until they are decided), and the task learns which
    transactions in its ranges were aborted, to leave them out.
    """
    budget = options.max_task_bytes * options.max_tasks_per_run
    room = RUN_RECORD_BYTES
    split = (options.max_task_bytes, options.max_tasks_per_run)
    chosen: list[StreamPlan] = []
    aborted: list[tuple[int, int, int, int]] = []
    units = {t.name: unit for t in topics if (unit := time_partition(t.configs)) is not None}
    typed = {t.name: sides for t in topics if (sides := typed_sides(t.configs))}
    codecs = codecs_of(topics, options)
    for topic in topics:
        for partition, stream_id in enumerate(topic.streams):
            if stream_id in busy:
                continue
            backlog = await read_backlog(index, stream_id, backlogs)
            if backlog.oldest_ms is None:
                continue  # nothing in the WAL
            if not force and not _is_due(backlog.size, backlog.oldest_ms, topic, options, now_ms):
                continue
            # A topic split by time may write a file per entry (one per hour or day).
            per_file = FILE_RECORD_BYTES + len(topic.name) if topic.name in units else 0
            stream_room = room - stream_record_bytes(topic.name)
            wal_entries = index.entries(stream_id, after_end=backlog.tables_end)
            async with contextlib.aclosing(wal_entries):
                entries = await _taken(
                    wal_entries, options, now_ms, force, budget, stream_room, per_file
                )
            if entries and transactions is not None:
                entries = await _stable(transactions, stream_id, entries, aborted)
            if entries:
                chosen.append(StreamPlan(topic.name, partition, stream_id, tuple(entries)))
                budget -= sum(e.size for e in entries)
                room = stream_room - sum(entry_record_bytes(e) + per_file for e in entries)
            if budget <= 0 or room < stream_record_bytes(topic.name) + ENTRY_RECORD_BYTES:
                return plan_of(
                    chosen, units, TaskKind.COMPACT, aborted, *split, typed=typed, codecs=codecs
                )
    if not chosen:
        return None
    return plan_of(chosen, units, TaskKind.COMPACT, aborted, *split, typed=typed, codecs=codecs)


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


def _is_due(
    size: int, oldest_ms: int, topic: Topic, options: CompactorOptions, now_ms: int
) -> bool:
    """Whether a stream whose WAL part holds ``size`` bytes, the oldest written at
    ``oldest_ms``, is due: it holds ``min_bytes`` or has waited ``max_age``."""
    max_age_ms = int(topic.configs.get(MAX_AGE_CONFIG, options.max_age_s * 1000))
    min_bytes = int(topic.configs.get(MIN_BYTES_CONFIG, options.min_bytes))
    return size >= min_bytes or waited_ms(now_ms, oldest_ms) >= max_age_ms


def stream_record_bytes(topic: str) -> int:
    """What a stream adds to a run's saga record besides its entries: its share of a task
    (output key), its replaced entries' header, and its written file (path, description)."""
    return STREAM_RECORD_BYTES + 4 * len(topic)


def entry_record_bytes(entry: IndexEntry) -> int:
    """What replacing ``entry`` adds to a run's saga record."""
    location = entry.location
    name = location.ref if isinstance(location, WalLocation) else location.key
    return ENTRY_RECORD_BYTES + len(name)


async def _taken(
    entries: AsyncIterator[IndexEntry],
    options: CompactorOptions,
    now_ms: int,
    force: bool,
    budget: int,
    room: int,
    per_file: int,
) -> list[IndexEntry]:
    """The due stream's WAL entries a run takes: contiguous from the first, old enough, and
    as many as fit in ``room`` bytes of the run's record (each taking ``per_file`` more for
    a file of its own). Reads no further than it takes: a stream far behind holds many more."""
    taken: list[IndexEntry] = []
    async for entry in entries:
        room -= entry_record_bytes(entry) + per_file
        if room < 0:
            break
        if not entry.in_wal:
            if taken:
                break
            continue  # compacted since the backlog was read
        if not force and waited_ms(now_ms, entry.created_ms) < options.min_age_s * 1000:
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
    max_task_bytes: int | None = None,
    max_tasks: int = 1,
    *,
    typed: Mapping[str, tuple[str, ...]] | None = None,
    codecs: Mapping[str, str] | None = None,
) -> Plan:
    """The run reading every entry of ``streams`` (WAL chunks or whole data files) into one
    file per stream, split by time for the topics in ``units``, leaving out ``aborted``
    transactions (see :attr:`CompactionTask.aborted`). With ``max_task_bytes``, WAL entries
    are spread over up to ``max_tasks`` tasks of about that size (:func:`split_by_objects`);
    otherwise one task. The streams of topics in ``typed`` decode those sides into typed
    columns (:attr:`CompactionTask.typed`); those in ``codecs`` compress their data files
    with that codec (:func:`codecs_of`)."""
    typed = typed or {}
    codecs = codecs or {}
    run_id = uuid.uuid4().hex
    groups = [list(streams)]
    if max_task_bytes is not None and all(e.in_wal for s in streams for e in s.entries):
        groups = split_by_objects(streams, max_task_bytes, max_tasks)
    tasks = []
    for i, group in enumerate(groups):
        ids = {s.stream_id for s in group}
        task = CompactionTask(
            run_id if len(groups) == 1 else f"{run_id}-{i}",
            tuple(source_range(s, entry) for s in group for entry in s.entries),
            tuple((s.stream_id, s.output_path) for s in group),
            tuple((s.stream_id, units[s.topic]) for s in group if s.topic in units),
            aborted=tuple(a for a in aborted if a[0] in ids),
            typed=tuple((s.stream_id, s.topic, typed[s.topic]) for s in group if s.topic in typed),
            codecs=tuple((s.stream_id, codecs[s.topic]) for s in group if s.topic in codecs),
        )
        tasks.append(task)
    return Plan(tuple(tasks), tuple(streams), kind)


def codecs_of(topics: Iterable[Topic], options: CompactorOptions) -> dict[str, str]:
    """The topics among ``topics`` whose data files take another codec than zstd, with it."""
    return {
        t.name: codec for t in topics if (codec := table_codec(t.configs, options)) != DEFAULT_CODEC
    }


def split_by_objects(
    streams: Sequence[StreamPlan], max_bytes: int, max_tasks: int = 1 << 30
) -> list[list[StreamPlan]]:
    """``streams``' WAL entries cut into at most ``max_tasks`` groups of about ``max_bytes``
    (more if there are too many groups) that share no WAL object, each stream's share of a
    group one contiguous run of its entries.

    WAL objects are ordered so that every stream's entries move forward through them: an
    object comes before the one holding the stream's next entry. Objects whose orders cross
    (two brokers writing chunks of the same streams in different orders) are one unit. The
    units, in that order, are cut into consecutive groups, so each stream's entries in a
    group are consecutive too.
    """
    after: dict[str, set[str]] = defaultdict(set)
    size: dict[str, int] = defaultdict(int)
    for s in streams:
        refs = [_ref(e) for e in s.entries]
        for entry, ref in zip(s.entries, refs, strict=True):
            size[ref] += entry.size
        for a, b in itertools.pairwise(refs):
            if a != b:
                after[a].add(b)
    units = _ordered_components(list(size), after)
    # A group closes once it holds the target: so no more than max_tasks groups.
    target = max(max_bytes, -(-sum(size.values()) // max_tasks))
    groups: list[set[str]] = [set()]
    taken = 0
    for unit in units:
        if taken >= target:
            groups.append(set())
            taken = 0
        groups[-1].update(unit)
        taken += sum(size[ref] for ref in unit)
    out = []
    for objects in groups:
        group = []
        for s in streams:
            entries = tuple(e for e in s.entries if _ref(e) in objects)
            if entries:
                group.append(dataclasses.replace(s, entries=entries))
        out.append(group)
    return out


def _ref(entry: IndexEntry) -> str:
    assert isinstance(entry.location, WalLocation)
    return entry.location.ref


def _ordered_components(nodes: list[str], after: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of the graph ``after`` (Tarjan's algorithm), in
    topological order: a component comes before every component it has an edge to."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(after.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    found.append(component)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(after.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    # Tarjan finds a component after every component it reaches: reversed is topological.
    return found[::-1]


def source_range(stream: StreamPlan, entry: IndexEntry) -> StreamRange:
    """Where a task reads ``entry``: its chunk of a WAL object, or its whole data file."""
    location = entry.location
    if isinstance(location, WalLocation):
        end = location.position + location.length
        source = (location.ref, location.position, end, Source.WAL)
    else:
        source = (location.key, 0, location.size, Source.PARQUET)
    return StreamRange(stream.stream_id, stream.partition, entry.start, entry.end, *source)
