"""Table maintenance: merging small data files, and deleting files nothing references.

Compaction writes one data file per partition per task, so a quiet topic compacted every
``max_age_s`` accumulates many small files, which slow every table scan and every catch-up
read. A *rewrite* task merges a run of a partition's consecutive small files into one; it goes
through the same saga as compaction (:mod:`icefloe.compaction.committer`), so the tables and
the offset index switch to the new file together and Kafka consumers read the same records.

An *orphan* is a file under a table's root that no index entry, no table format, no retired
list and no unfinished task references (a crash of an older version, a table format switched
off while retention ran). Orphans older than the topic's ``icefloe.table.orphan.age.ms`` are
deleted.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Self

from icefloe.compaction.committer import Committer
from icefloe.compaction.planner import Plan, StreamPlan, TaskKind, codecs_of, plan_of
from icefloe.config.compactor import CompactorOptions
from icefloe.errors import NotFoundError
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableFormat, TimePartition
from icefloe.quiet_log import summary
from icefloe.storage.index import IndexEntry, ParquetLocation
from icefloe.storage.index_reader import IndexReader
from icefloe.tables import layout
from icefloe.topics.configs import (
    HISTORY_CONFIG,
    ORPHAN_AGE_CONFIG,
    REWRITE_MIN_FILES_CONFIG,
    REWRITE_TARGET_CONFIG,
    TABLE_RETENTION_CONFIG,
    time_partition,
)
from icefloe.topics.registry import Topic

log = logging.getLogger(__name__)

SMALL_FRACTION: Final = 0.75
"""A data file under this fraction of the target size is small."""
MAX_GROUP: Final = 10_000
"""Consecutive small files looked at together (bounds memory on a long neglected index)."""
SPANNING: Final = -(2**63)
"""The bucket of an entry whose records fall in several hours (days)."""


@dataclass(frozen=True, slots=True)
class TableSettings:
    """A topic's table maintenance settings: its topic configs, else ``[compactor]``."""

    rewrite_target_bytes: int
    rewrite_min_files: int
    history_ms: int
    orphan_age_ms: int
    delete_with_retention: bool

    @classmethod
    def of(cls, topic: Topic, options: CompactorOptions) -> Self:
        configs = topic.configs
        return cls(
            rewrite_target_bytes=int(
                configs.get(REWRITE_TARGET_CONFIG, options.rewrite_target_bytes)
            ),
            rewrite_min_files=int(configs.get(REWRITE_MIN_FILES_CONFIG, options.rewrite_min_files)),
            history_ms=int(configs.get(HISTORY_CONFIG, options.history_retention_s * 1000)),
            orphan_age_ms=int(configs.get(ORPHAN_AGE_CONFIG, options.orphan_age_s * 1000)),
            delete_with_retention=configs.get(TABLE_RETENTION_CONFIG) == "delete",
        )


async def plan_rewrite(
    index: IndexReader, topics: Sequence[Topic], options: CompactorOptions
) -> Plan | None:
    """The next rewrite: the first partition with enough consecutive small files."""
    for topic in topics:
        settings = TableSettings.of(topic, options)
        target = min(settings.rewrite_target_bytes, options.max_task_bytes)
        if target <= 0:
            continue
        unit = time_partition(topic.configs)
        for partition, stream_id in enumerate(topic.streams):
            entries = index.entries(stream_id)
            run = await small_run(entries, target, settings.rewrite_min_files, unit)
            if run:
                stream = StreamPlan(topic.name, partition, stream_id, run)
                units = {topic.name: unit} if unit is not None else {}
                codecs = codecs_of((topic,), options)
                return plan_of((stream,), units, TaskKind.REWRITE, codecs=codecs)
    return None


async def small_run(
    entries: AsyncIterable[IndexEntry],
    target_bytes: int,
    min_files: int,
    unit: TimePartition | None = None,
) -> tuple[IndexEntry, ...]:
    """The first run of a stream's ``entries`` (in offset order) worth merging, or ``()``.

    A run is at least ``min_files`` consecutive small data files, at most ``target_bytes`` in
    all, none of them more than half the run. The last rule keeps merging tiered: a merged file
    is merged again only with as many bytes of newer files, so each byte is rewritten about
    log2(target / small file) times, not once per merge. With a time ``unit``, a run's files
    are all of one hour (day), as the table's partitions are.
    """
    group: list[IndexEntry] = []  # consecutive small data files of one hour (day)
    group_bucket: int | None = None
    async for entry in entries:
        bucket = _bucket(entry, unit)
        # A file whose records span several hours has no time partition: never merged.
        small = not entry.in_wal and entry.size < target_bytes * SMALL_FRACTION
        small = small and bucket != SPANNING
        joins = bool(group) and entry.start == group[-1].end and bucket == group_bucket
        if small and joins and len(group) < MAX_GROUP:
            group.append(entry)
            continue
        if run := _best_run(group, target_bytes, min_files):
            return run
        group, group_bucket = ([entry], bucket) if small else ([], None)
    return _best_run(group, target_bytes, min_files)


def _bucket(entry: IndexEntry, unit: TimePartition | None) -> int | None:
    """The hour (day) of every record of ``entry``, or :data:`SPANNING`."""
    if unit is None:
        return None
    first, last = unit.bucket(entry.min_timestamp), unit.bucket(entry.max_timestamp)
    return first if first == last else SPANNING


def _best_run(
    group: Sequence[IndexEntry], target_bytes: int, min_files: int
) -> tuple[IndexEntry, ...]:
    """The longest valid run from the first start position in ``group`` that has one."""
    for first in range(len(group) - min_files + 1):
        best = 0
        total = largest = 0
        for last in range(first, len(group)):
            size = group[last].size
            total += size
            largest = max(largest, size)
            if total > target_bytes:
                break
            if last - first + 1 >= min_files and largest * 2 <= total:
                best = last + 1
        if best:
            return tuple(group[first:best])
    return ()


async def sweep_orphans(
    topic: Topic,
    *,
    index: IndexReader,
    store: ObjectStore,
    committer: Committer,
    table_formats: Mapping[str, TableFormat],
    older_than_s: float,
) -> list[str]:
    """Delete the topic's unreferenced data files last modified before ``older_than_s``."""
    root = layout.table_root(topic.name) + "/"
    candidates = [
        info.key
        async for info in store.list(root)
        if info.modified < older_than_s and _is_data_file(info.key.removeprefix(root))
    ]
    if not candidates:
        return []
    # Listed first, references read second: a file referenced in between is younger than the
    # cutoff, so it is not a candidate.
    referenced = await committer.retired()
    for record in await committer.unfinished():
        referenced.update(r.ref for r in record.ranges)
        referenced.update(path for task in record.tasks for _, path in task.output_paths)
    for stream_id in topic.streams:
        async for entry in index.entries(stream_id):
            if isinstance(entry.location, ParquetLocation):
                referenced.add(entry.location.key)
    spec = committer.table_spec(topic.name)
    for table_format in table_formats.values():
        try:
            files = await table_format.files(spec)
        except NotFoundError:
            continue  # no table yet: it references nothing
        referenced.update(f"{root}{f.path}" for f in files)
    orphans = [key for key in candidates if key not in referenced]
    for key in orphans:
        log.debug("deleting orphaned data file %s", key)
        await store.delete(key)
    if orphans:
        log.info("deleted %s of topic %s", summary(orphans, "orphaned data file"), topic.name)
    return orphans


def _is_data_file(relative: str) -> bool:
    """A data file of the table root (not a Delta log or checkpoint file)."""
    return relative.startswith("partition=") and relative.endswith(".parquet")
