"""Running one compaction task: read each source once, split by stream, write Parquet.

A task either compacts WAL chunks (decoding their record batches into rows) or merges small
Parquet data files of a stream into one (table maintenance: rows are copied, not re-decoded).

The same function runs in the in-process engine's worker process and on Spark executors: it
opens the WAL and object store from the configuration it is given, so it needs nothing from the
process that planned the task.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe import config as configuration
from icefloe.errors import CorruptDataError
from icefloe.ports.base import OpenContext
from icefloe.ports.compaction import (
    CompactionTask,
    Source,
    StreamRange,
    WrittenFile,
    piece_path,
)
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TimePartition
from icefloe.ports.wal import WAL
from icefloe.storage.batch import read_header
from icefloe.storage.parquet import RowBuilder, encode_parquet
from icefloe.storage.row_schema import OFFSET, ROW_SCHEMA, TIMESTAMP

Pieces = list[tuple[StreamRange, memoryview]]


async def execute(task: CompactionTask, wal: WAL, store: ObjectStore) -> list[WrittenFile]:
    """Run ``task``: one GET per source; one Parquet file per stream, or per run of records in
    one hour (day) for a stream split by time."""
    pieces: dict[int, Pieces] = defaultdict(list)
    for ref in task.refs():
        ranges = [r for r in task.ranges if r.ref == ref]
        if ranges[0].source is Source.PARQUET:
            data = memoryview(await store.get(ref))
            pieces[ranges[0].stream_id].append((ranges[0], data))
            continue
        wal_object = memoryview(await wal.read(ref))
        for r in ranges:
            pieces[r.stream_id].append((r, wal_object[r.byte_start : r.byte_end]))
    outputs = dict(task.output_paths)
    units = dict(task.time_partitions)
    written = []
    for stream_id, stream_pieces in sorted(pieces.items()):
        stream_pieces.sort(key=lambda piece: piece[0].start_offset)
        if len({r.source for r, _ in stream_pieces}) != 1:
            raise ValueError(f"stream {stream_id}: a task may not mix WAL and Parquet sources")
        rows = _merge_files if stream_pieces[0][0].source is Source.PARQUET else _decode_chunks
        table = await asyncio.to_thread(rows, stream_id, stream_pieces)
        unit = units.get(stream_id)
        for run in _runs(table, unit):
            parquet, facts = await asyncio.to_thread(_encode, run)
            path = outputs[stream_id]
            if unit is not None:
                path = piece_path(path, stream_id, facts["start_offset"], facts["end_offset"])
                facts["time_bucket"] = unit.bucket(facts["min_timestamp"])
            await store.put(path, parquet)
            written.append(WrittenFile(task.task_id, stream_id, path, len(parquet), **facts))
    return written


def _decode_chunks(stream_id: int, pieces: Pieces) -> pa.Table:
    """A stream's rows from its WAL chunks (in offset order)."""
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
            builder.add_batch(chunk[position : position + header.size], offset)
            offset += header.last_offset_delta + 1
            position += header.size
        if offset != r.end_offset:
            raise CorruptDataError(
                f"stream {stream_id}: chunk holds offsets up to {offset}, index says {r.end_offset}"
            )
        expected = r.end_offset
    return builder.table()


def _merge_files(stream_id: int, pieces: Pieces) -> pa.Table:
    """A stream's rows from its consecutive data files (in offset order)."""
    tables = []
    expected = pieces[0][0].start_offset
    for r, source in pieces:
        try:
            table = pq.read_table(pa.py_buffer(source), schema=ROW_SCHEMA)
        except (pa.ArrowException, OSError) as exc:
            raise CorruptDataError(f"stream {stream_id}: data file {r.ref!r}: {exc}") from exc
        offsets = table.column(OFFSET)
        held = (offsets[0].as_py(), offsets[-1].as_py() + 1) if table.num_rows else None
        complete = table.num_rows == r.end_offset - r.start_offset
        if r.start_offset != expected or held != (r.start_offset, r.end_offset) or not complete:
            raise CorruptDataError(
                f"stream {stream_id}: data file {r.ref!r} holds offsets {held}, the task "
                f"expects [{r.start_offset}, {r.end_offset}) right after offset {expected}"
            )
        tables.append(table)
        expected = r.end_offset
    return pa.concat_tables(tables)


def _runs(table: pa.Table, unit: TimePartition | None) -> list[pa.Table]:
    """``table`` cut wherever the hour (day) of the timestamp changes; whole without a unit.

    Records keep their offset order, so a run may end inside a producer's batch: the two parts
    are read back as two batches with the batch's base offset, as Kafka serves a batch that
    log compaction thinned out.
    """
    if unit is None or table.num_rows == 0:
        return [table]
    millis = table.column(TIMESTAMP).cast(pa.int64()).to_numpy() // 1000
    buckets = millis // unit.millis
    cuts = (np.flatnonzero(buckets[1:] != buckets[:-1]) + 1).tolist()
    bounds = [0, *cuts, table.num_rows]
    return [table.slice(a, b - a) for a, b in itertools.pairwise(bounds)]


def _encode(table: pa.Table) -> tuple[bytes, dict[str, Any]]:
    """One data file of ``table`` (a stream's consecutive records) and its facts."""
    data, groups = encode_parquet(table)
    offsets = table.column(OFFSET)
    timestamps = pc.min_max(table.column(TIMESTAMP).cast(pa.int64()))
    facts = {
        "record_count": table.num_rows,
        "start_offset": offsets[0].as_py(),
        "end_offset": offsets[-1].as_py() + 1,
        "row_groups": tuple((g.first, g.last) for g in groups),
        "min_timestamp": timestamps["min"].as_py() // 1000,  # µs → ms
        "max_timestamp": timestamps["max"].as_py() // 1000,
    }
    return data, facts


class WorkerResult(NamedTuple):
    files: list[WrittenFile]
    requests: dict[str, dict[str, int]]
    """The object-store requests the task sent (:meth:`RequestStats.snapshot`), so that the
    broker's metrics count them too."""


def run_task_in_worker(config: configuration.Config, task: CompactionTask) -> WorkerResult:
    """Open the WAL and object store from ``config`` and run ``task`` (blocking)."""

    async def main() -> WorkerResult:
        context = OpenContext(data_dir=config.data_dir)
        store = await configuration.resolve_one(config, ObjectStore).open(context)
        try:
            wal_context = OpenContext(data_dir=config.data_dir, object_store=store)
            wal = await configuration.resolve_one(config, WAL).open(wal_context)
            try:
                return WorkerResult(await execute(task, wal, store), store.stats.snapshot())
            finally:
                await wal.close()
        finally:
            await store.close()

    return asyncio.run(main())
