"""Running one compaction task: read each source once, split by stream, write Parquet.

A task either compacts WAL chunks (decoding their record batches into rows), merges small
Parquet data files of a stream into one (table maintenance: rows are copied, not re-decoded),
or log-compacts a stream's data files (:mod:`icefloe.compaction.log_cleaning`).

The same function runs in the in-process engine's worker process and on Spark executors: it
opens the WAL and object store from the configuration it is given, so it needs nothing from the
process that planned the task. A task of a schema-backed topic also opens the schema lookup
(the registry in the metadata store, or the external one configured): only the task sees
which schema ids its records carry, and a schema never changes under its id, so the task
resolves each id it meets once rather than carrying every schema a topic might use.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from icefloe import config as configuration
from icefloe.compaction import log_cleaning
from icefloe.errors import CorruptDataError
from icefloe.plugins import BackendRegistry
from icefloe.ports.base import OpenContext
from icefloe.ports.compaction import (
    CompactionTask,
    Source,
    StreamRange,
    WrittenFile,
    piece_path,
)
from icefloe.ports.metadata import MetadataStore
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TimePartition
from icefloe.ports.wal import WAL
from icefloe.schemas import columns
from icefloe.schemas.model import SchemaLookup
from icefloe.storage.batch import MIN_BATCH_LENGTH, BatchHeader, read_header
from icefloe.storage.parquet import (
    DEFAULT_CODEC,
    RowBuilder,
    encode_data_file,
    encode_dead_letters,
)
from icefloe.storage.row_schema import OFFSET, PARTITION, TIMESTAMP
from icefloe.tables import layout

Pieces = list[tuple[StreamRange, memoryview]]


async def execute(
    task: CompactionTask, wal: WAL, store: ObjectStore, lookup: SchemaLookup | None = None
) -> list[WrittenFile]:
    """Run ``task``: one GET per source; one Parquet file per stream, or per run of records in
    one hour (day) for a stream split by time. A stream being log-compacted reads its data
    files one at a time (its dirty ones twice) and writes one file per source. The streams of
    ``task.typed`` get typed columns, their schemas found through ``lookup``."""
    pieces: dict[int, Pieces] = defaultdict(list)
    outputs = dict(task.output_paths)
    units = dict(task.time_partitions)
    cleaning = dict(task.cleaning)
    typed = {stream_id: (topic, sides) for stream_id, topic, sides in task.typed}
    codecs = dict(task.codecs)
    if typed and lookup is None:
        raise ValueError("a task with typed columns needs a schema lookup")
    written = []
    for stream_id, spec in sorted(cleaning.items()):
        ranges = sorted(
            (r for r in task.ranges if r.stream_id == stream_id), key=lambda r: r.start_offset
        )
        if not ranges or any(r.source is not Source.PARQUET for r in ranges):
            raise ValueError(f"stream {stream_id}: log compaction reads data files only")
        written += await log_cleaning.clean_stream(
            task.task_id,
            ranges,
            spec,
            outputs[stream_id],
            units.get(stream_id),
            store,
            codecs.get(stream_id, DEFAULT_CODEC),
        )
    by_source: dict[str, list[StreamRange]] = defaultdict(list)
    for r in task.ranges:
        if r.stream_id not in cleaning:
            by_source[r.ref].append(r)
    for ref, ranges in by_source.items():
        if ranges[0].source is Source.PARQUET:
            data = memoryview(await store.get(ref))
            pieces[ranges[0].stream_id].append((ranges[0], data))
            continue
        # Only the span of the task's chunks: a WAL object holds chunks of many streams, and
        # a run that takes one stream far behind would otherwise read every object whole.
        first = min(r.byte_start for r in ranges)
        span = memoryview(await wal.read(ref, first, max(r.byte_end for r in ranges)))
        for r in ranges:
            pieces[r.stream_id].append((r, span[r.byte_start - first : r.byte_end - first]))
    for stream_id, stream_pieces in sorted(pieces.items()):
        stream_pieces.sort(key=lambda piece: piece[0].start_offset)
        if len({r.source for r, _ in stream_pieces}) != 1:
            raise ValueError(f"stream {stream_id}: a task may not mix WAL and Parquet sources")
        if stream_pieces[0][0].source is Source.PARQUET:
            table = await asyncio.to_thread(_merge_files, stream_id, stream_pieces)
        else:
            aborted = [a[1:] for a in task.aborted if a[0] == stream_id]
            table = await asyncio.to_thread(_decode_chunks, stream_id, stream_pieces, aborted)
            if stream_id in typed:
                assert lookup is not None
                table = await _typed_columns(table, *typed[stream_id], lookup)
        unit = units.get(stream_id)
        first, last = stream_pieces[0][0].start_offset, stream_pieces[-1][0].end_offset
        codec = codecs.get(stream_id, DEFAULT_CODEC)
        for run, start, end in _runs(table, unit, first, last):
            parquet, facts = await asyncio.to_thread(encode_data_file, run, start, end, codec)
            path = outputs[stream_id]
            if unit is not None:
                path = piece_path(path, stream_id, facts["start_offset"], facts["end_offset"])
                facts["time_bucket"] = unit.bucket(facts["min_timestamp"])
            if stream_id in typed:
                facts |= await _dead_letters(run, *typed[stream_id], path, store, codec)
            await store.put(path, parquet)
            written.append(WrittenFile(task.task_id, stream_id, path, len(parquet), **facts))
    return written


async def _dead_letters(
    run: pa.Table, topic: str, sides: Sequence[str], path: str, store: ObjectStore, codec: str
) -> dict[str, Any]:
    """The dead-letter facts of a data file: how many of its records did not decode and, if
    any did not, the file of their rows for the topic's dead-letter table (written here, named
    as the data file, under the dead-letter root)."""
    rows = columns.dead_letter_rows(run, sides)
    if rows.num_rows == 0:
        return {"dead_letters": 0}
    partition = int(rows.column(PARTITION)[0].as_py())
    key = layout.dead_letter_file(topic, partition, path.rpartition("/")[2])
    data = await asyncio.to_thread(encode_dead_letters, rows, codec)
    await store.put(key, data)
    return {"dead_letters": rows.num_rows, "dead_letter_path": key, "dead_letter_size": len(data)}


async def _typed_columns(
    table: pa.Table, topic: str, sides: Sequence[str], lookup: SchemaLookup
) -> pa.Table:
    """``table`` with the typed columns of ``sides``: the versions of the topic's subjects and
    the schemas of the ids its records carry are looked up first (a registry that cannot
    answer fails the task, to be retried: an unreachable registry must not turn records into
    dead letters), then decoded on a thread."""
    ids = set()
    versions = {}
    for side in sides:
        versions[side] = await columns.subject_ids(columns.subject(topic, side), lookup)
        ids |= columns.distinct_schema_ids(table.column(side)) | set(versions[side])
    resolved = await columns.resolve(ids, lookup)
    typed, _ = await asyncio.to_thread(columns.add_columns, table, sides, resolved, versions)
    return typed


def _decode_chunks(
    stream_id: int, pieces: Pieces, aborted: Sequence[tuple[int, int, int]] = ()
) -> pa.Table:
    """A stream's rows from its WAL chunks (in offset order), without transaction markers and
    the batches of ``aborted`` transactions ((producer id, first offset, marker offset))."""
    builder = RowBuilder(pieces[0][0].partition)
    expected = pieces[0][0].start_offset
    for r, chunk in pieces:
        if r.start_offset != expected:
            raise CorruptDataError(
                f"stream {stream_id}: compaction ranges leave a gap at offset {expected}"
            )
        offset = r.start_offset
        position = 0
        while position < len(chunk):
            header = read_header(chunk, position)
            if header.batch_length < MIN_BATCH_LENGTH or header.size > len(chunk) - position:
                # Chunks are read without the object's checksum: a length changed in storage
                # would otherwise make this loop stand still (a skipped batch of 0 bytes) or
                # go back.
                raise CorruptDataError(
                    f"stream {stream_id}: the batch at byte {position} of a WAL chunk declares "
                    f"batchLength {header.batch_length}, but {len(chunk) - position} bytes are "
                    "left: not whole record batches"
                )
            if not header.is_control and not _aborted(header, offset, aborted):
                # Compaction stops at the last stable offset: what is not aborted committed.
                batch = chunk[position : position + header.size]
                builder.add_batch(batch, offset, committed=header.is_transactional)
            offset += header.last_offset_delta + 1
            position += header.size
        if offset != r.end_offset:
            raise CorruptDataError(
                f"stream {stream_id}: chunk holds offsets up to {offset}, index says {r.end_offset}"
            )
        expected = r.end_offset
    return builder.table()


def _aborted(header: BatchHeader, offset: int, aborted: Sequence[tuple[int, int, int]]) -> bool:
    """Whether the batch at ``offset`` belongs to one of the ``aborted`` transactions."""
    return header.is_transactional and any(
        producer == header.producer_id and first <= offset < marker
        for producer, first, marker in aborted
    )


def _merge_files(stream_id: int, pieces: Pieces) -> pa.Table:
    """A stream's rows from its consecutive data files (in offset order). A file that log
    compaction thinned holds fewer rows than offsets."""
    tables = []
    expected = pieces[0][0].start_offset
    for r, source in pieces:
        if r.start_offset != expected:
            raise CorruptDataError(
                f"stream {stream_id}: data file {r.ref!r} starts at {r.start_offset}, the task "
                f"expects offset {expected}"
            )
        tables.append(log_cleaning.read_rows(source, r))
        expected = r.end_offset
    # Files of a schema-backed topic may hold different versions of its typed columns:
    # their structs merge by field name, as the tables' schemas did.
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as exc:
        raise CorruptDataError(f"stream {stream_id}: data files do not merge: {exc}") from exc


def _runs(
    table: pa.Table, unit: TimePartition | None, start: int, end: int
) -> list[tuple[pa.Table, int, int]]:
    """``table`` (offsets ``[start, end)``) cut wherever the hour (day) of the timestamp
    changes, each run with the offsets it covers; whole without a unit.

    Records keep their offset order, so a run may end inside a producer's batch: the two parts
    are read back as two batches with the batch's base offset, as Kafka serves a batch that
    log compaction thinned out. A run covers the offsets up to the next run's first record.
    """
    if unit is None or table.num_rows == 0:
        return [(table, start, end)]
    millis = table.column(TIMESTAMP).cast(pa.int64()).to_numpy() // 1000
    buckets = millis // unit.millis
    cuts = (np.flatnonzero(buckets[1:] != buckets[:-1]) + 1).tolist()
    offsets = table.column(OFFSET)
    firsts = [start, *(int(offsets[c].as_py()) for c in cuts)]
    ends = [*firsts[1:], end]
    bounds = [0, *cuts, table.num_rows]
    return [
        (table.slice(a, b - a), first, last)
        for (a, b), first, last in zip(itertools.pairwise(bounds), firsts, ends, strict=True)
    ]


@contextlib.asynccontextmanager
async def _schema_lookup(
    config: configuration.Config, task: CompactionTask
) -> AsyncIterator[SchemaLookup | None]:
    """The schema lookup a task with typed columns needs (none otherwise): an external
    registry's, or the metadata store's, opened here and closed after the task."""
    if not task.typed:
        yield None
        return
    from icefloe.schemas.lookup import open_lookup

    metadata = None
    if config.schema_registry.url is None:
        context = OpenContext(data_dir=config.data_dir)
        metadata = await configuration.resolve_one(config, MetadataStore, _backends()).open(context)
    try:
        lookup = open_lookup(config, metadata)  # type: ignore[arg-type]
        try:
            yield lookup
        finally:
            await lookup.close()
    finally:
        if metadata is not None:
            await metadata.close()


class WorkerResult(NamedTuple):
    files: list[WrittenFile]
    requests: dict[str, dict[str, int]]
    """The object-store requests the task sent (:meth:`RequestStats.snapshot`), so that the
    broker's metrics count them too."""


@functools.cache
def _backends() -> BackendRegistry:
    """The installed backends, found once per worker process rather than once per task (the
    entry points are read from every installed distribution's metadata)."""
    return BackendRegistry()


def run_task_in_worker(config: configuration.Config, task: CompactionTask) -> WorkerResult:
    """Open the WAL and object store from ``config`` and run ``task`` (blocking)."""

    async def main() -> WorkerResult:
        context = OpenContext(data_dir=config.data_dir)
        store = await configuration.resolve_one(config, ObjectStore, _backends()).open(context)
        try:
            wal_context = OpenContext(data_dir=config.data_dir, object_store=store, config=config)
            wal = await configuration.resolve_one(config, WAL, _backends()).open(wal_context)
            try:
                async with _schema_lookup(config, task) as lookup:
                    files = await execute(task, wal, store, lookup)
                return WorkerResult(files, store.stats.snapshot())
            finally:
                await wal.close()
        finally:
            await store.close()

    return asyncio.run(main())
