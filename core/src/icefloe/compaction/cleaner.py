"""Choosing what log compaction cleans (topics with ``cleanup.policy`` containing ``compact``).

Log compaction works on a partition's *data files*, Kafka's cleaner on its log segments: the
WAL part of a stream is to a compacted topic what Kafka's active segment is, never cleaned,
and becomes cleanable once compaction turns it into Parquet (within the topic's
``icefloe.compaction.max.age.ms``). A stream's cleanable range is its leading data files up to
the first WAL entry, and up to the first file holding a record younger than
``min.compaction.lag.ms`` (by record timestamp, as Kafka uses a segment's largest timestamp).

The committer records how far each stream is clean (:class:`Cleaned`). What lies beyond is
*dirty*. A stream is cleaned when, within its cleanable range,

- the dirty bytes are at least ``min.cleanable.dirty.ratio`` of all bytes (Kafka's trigger,
  with data-file bytes for log bytes), or
- the oldest dirty record is older than ``max.compaction.lag.ms`` (by its timestamp), or
- the earliest tombstone the last cleaning kept is past ``delete.retention.ms`` (as Kafka
  cleans a log whose delete horizon has passed).

A task cleans the whole cleanable range of each stream it takes (every file is rewritten, as
Kafka recopies every segment), but reads at most ``[compactor] max_task_bytes`` of dirty
files into its key map: a longer dirty part is cleaned in several rounds, front first.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Self

from icefloe.compaction.committer import Cleaned, Committer
from icefloe.compaction.planner import Plan, StreamPlan, TaskKind, codecs_of, source_range
from icefloe.config.compactor import CompactorOptions
from icefloe.config.storage import StorageOptions
from icefloe.ports.compaction import CleanSpec, CompactionTask
from icefloe.storage.index import IndexEntry
from icefloe.storage.index_reader import IndexReader
from icefloe.topics.configs import (
    CLEANUP_POLICY_CONFIG,
    DELETE_RETENTION_CONFIG,
    DIRTY_RATIO_CONFIG,
    MAX_COMPACTION_LAG_CONFIG,
    MIN_COMPACTION_LAG_CONFIG,
    effective_value,
    split_list,
    time_partition,
)
from icefloe.topics.registry import Topic


@dataclass(frozen=True, slots=True)
class CleanSettings:
    """A topic's log-compaction configs, in effect (its own, else Kafka's defaults)."""

    compact: bool
    delete_retention_ms: int
    min_lag_ms: int
    max_lag_ms: int
    dirty_ratio: float

    @classmethod
    def of(cls, topic: Topic, storage: StorageOptions) -> Self:
        def value(name: str) -> str:
            return effective_value(topic.configs, name, storage)

        try:
            return cls(
                compact="compact" in split_list(value(CLEANUP_POLICY_CONFIG)),
                delete_retention_ms=int(value(DELETE_RETENTION_CONFIG)),
                min_lag_ms=int(value(MIN_COMPACTION_LAG_CONFIG)),
                max_lag_ms=int(value(MAX_COMPACTION_LAG_CONFIG)),
                dirty_ratio=float(value(DIRTY_RATIO_CONFIG)),
            )
        except ValueError:  # a stored value no validation let through: clean nothing
            return cls(False, 0, 0, 0, 1.0)


@dataclass(frozen=True, slots=True)
class Cleanable:
    """One stream's cleanable range and how dirty it is."""

    entries: tuple[IndexEntry, ...]
    dirty_start: int
    dirty_bytes: int
    clean_bytes: int
    due: bool


def cleanable(
    entries: Sequence[IndexEntry],
    cleaned: Cleaned | None,
    settings: CleanSettings,
    now_ms: int,
    max_dirty_bytes: int,
) -> Cleanable:
    """What of a stream (its index ``entries``, in offset order) may be cleaned now, and
    whether it is due (see the module docstring)."""
    taken: list[IndexEntry] = []
    cleaned_end = cleaned.end if cleaned is not None else -1
    dirty_bytes = clean_bytes = 0
    oldest_dirty = None
    for entry in entries:
        if entry.in_wal or entry.max_timestamp > now_ms - settings.min_lag_ms:
            break
        if entry.end <= cleaned_end:
            clean_bytes += entry.size
        else:
            if dirty_bytes and dirty_bytes + entry.size > max_dirty_bytes:
                break
            dirty_bytes += entry.size
            oldest = entry.min_timestamp
            oldest_dirty = oldest if oldest_dirty is None else min(oldest_dirty, oldest)
        taken.append(entry)
    if not taken:
        return Cleanable((), 0, 0, 0, False)
    dirty_start = max(taken[0].start, min(cleaned_end, taken[-1].end))
    total = dirty_bytes + clean_bytes
    by_ratio = dirty_bytes > 0 and dirty_bytes >= settings.dirty_ratio * total
    by_lag = oldest_dirty is not None and oldest_dirty <= now_ms - settings.max_lag_ms
    expiry = cleaned.tombstone_expiry_ms if cleaned is not None else None
    by_tombstone = expiry is not None and now_ms >= expiry
    due = by_ratio or by_lag or by_tombstone
    return Cleanable(tuple(taken), dirty_start, dirty_bytes, clean_bytes, due)


async def plan_clean(
    index: IndexReader,
    committer: Committer,
    topics: Sequence[Topic],
    options: CompactorOptions,
    storage: StorageOptions,
    now_ms: int,
    *,
    force: bool = False,
) -> Plan | None:
    """The next log-compaction task: the due streams of compacted topics, up to
    ``max_task_bytes`` of dirty bytes (at least one stream); ``None`` when none is due.
    ``force`` cleans every stream with anything dirty."""
    budget = options.max_task_bytes
    streams: list[StreamPlan] = []
    specs: list[tuple[int, CleanSpec]] = []
    units = {}
    for topic in topics:
        settings = CleanSettings.of(topic, storage)
        if not settings.compact:
            continue
        for partition, stream_id in enumerate(topic.streams):
            entries = [e async for e in index.entries(stream_id)]
            cleaned = await committer.cleaned(stream_id)
            found = cleanable(entries, cleaned, settings, now_ms, budget)
            if not found.entries or not (found.due or (force and found.dirty_bytes)):
                continue
            streams.append(StreamPlan(topic.name, partition, stream_id, found.entries))
            spec = CleanSpec(
                found.dirty_start,
                now_ms - settings.delete_retention_ms,
                settings.delete_retention_ms,
            )
            specs.append((stream_id, spec))
            if (unit := time_partition(topic.configs)) is not None:
                units[stream_id] = unit
            budget -= found.dirty_bytes
            if budget <= 0:
                break
        if budget <= 0:
            break
    if not streams:
        return None
    ranges = tuple(source_range(s, entry) for s in streams for entry in s.entries)
    outputs = tuple((s.stream_id, s.output_path) for s in streams)
    codecs = codecs_of(topics, options)
    task = CompactionTask(
        uuid.uuid4().hex,
        ranges,
        outputs,
        tuple(sorted(units.items())),
        tuple(specs),
        codecs=tuple((s.stream_id, codecs[s.topic]) for s in streams if s.topic in codecs),
    )
    return Plan((task,), tuple(streams), TaskKind.CLEAN)
