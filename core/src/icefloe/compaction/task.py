"""Running one compaction task: read each source once, split by stream, write Parquet.

A task either compacts WAL chunks (decoding their record batches into rows) or merges small
Parquet data files of a stream into one (table maintenance: rows are copied, not re-decoded).

The same function runs in the in-process engine's worker process and on Spark executors: it
opens the WAL and object store from the configuration it is given, so it needs nothing from the
process that planned the task.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe import config as configuration
from icefloe.errors import CorruptDataError
from icefloe.ports.base import OpenContext
from icefloe.ports.compaction import CompactionTask, Source, StreamRange, WrittenFile
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.storage.batch import read_header
from icefloe.storage.parquet import RowBuilder, encode_parquet
from icefloe.storage.row_schema import OFFSET, ROW_SCHEMA, TIMESTAMP

Pieces = list[tuple[StreamRange, memoryview]]


async def execute(task: CompactionTask, wal: WAL, store: ObjectStore) -> list[WrittenFile]:
    """Run ``task``: one GET per source, one Parquet file per stream."""
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
    written = []
    for stream_id, stream_pieces in sorted(pieces.items()):
        stream_pieces.sort(key=lambda piece: piece[0].start_offset)
        if len({r.source for r, _ in stream_pieces}) != 1:
            raise ValueError(f"stream {stream_id}: a task may not mix WAL and Parquet sources")
        encode = _merge_files if stream_pieces[0][0].source is Source.PARQUET else _encode_stream
        parquet, facts = await asyncio.to_thread(encode, stream_id, stream_pieces)
        await store.put(outputs[stream_id], parquet)
        written.append(
            WrittenFile(task.task_id, stream_id, outputs[stream_id], len(parquet), **facts)
        )
    return written


def _encode_stream(stream_id: int, pieces: Pieces) -> tuple[bytes, dict[str, Any]]:
    """Decode a stream's chunks (in offset order) and encode them as one Parquet file."""
    builder = RowBuilder(pieces[0][0].partition)
    expected = pieces[0][0].start_offset
    min_ts, max_ts = 2**63 - 1, -(2**63)
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
            min_ts = min(min_ts, header.base_timestamp)
            max_ts = max(max_ts, header.max_timestamp)
            offset += header.last_offset_delta + 1
            position += header.size
        if offset != r.end_offset:
            raise CorruptDataError(
                f"stream {stream_id}: chunk holds offsets up to {offset}, index says {r.end_offset}"
            )
        expected = r.end_offset
    data, groups = encode_parquet(builder.table())
    facts = {
        "record_count": builder.rows,
        "start_offset": pieces[0][0].start_offset,
        "end_offset": expected,
        "row_groups": tuple((g.first, g.last) for g in groups),
        "min_timestamp": min_ts,
        "max_timestamp": max_ts,
    }
    return data, facts


def _merge_files(stream_id: int, pieces: Pieces) -> tuple[bytes, dict[str, Any]]:
    """Concatenate a stream's consecutive data files (in offset order) into one."""
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
    merged = pa.concat_tables(tables)
    data, groups = encode_parquet(merged)
    timestamps = pc.min_max(merged.column(TIMESTAMP).cast(pa.int64()))
    facts = {
        "record_count": merged.num_rows,
        "start_offset": pieces[0][0].start_offset,
        "end_offset": expected,
        "row_groups": tuple((g.first, g.last) for g in groups),
        "min_timestamp": timestamps["min"].as_py() // 1000,  # µs → ms
        "max_timestamp": timestamps["max"].as_py() // 1000,
    }
    return data, facts


def run_task_in_worker(config: configuration.Config, task: CompactionTask) -> list[WrittenFile]:
    """Open the WAL and object store from ``config`` and run ``task`` (blocking)."""

    async def main() -> list[WrittenFile]:
        context = OpenContext(data_dir=config.data_dir)
        store = await configuration.resolve_one(config, ObjectStore).open(context)
        try:
            wal_context = OpenContext(data_dir=config.data_dir, object_store=store)
            wal = await configuration.resolve_one(config, WAL).open(wal_context)
            try:
                return await execute(task, wal, store)
            finally:
                await wal.close()
        finally:
            await store.close()

    return asyncio.run(main())
