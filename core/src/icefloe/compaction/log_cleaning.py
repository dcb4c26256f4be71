"""Log compaction (``cleanup.policy=compact``): the latest record of each key survives.

This is what a compaction task runs for a stream it cleans (see :class:`CleanSpec`), as
Kafka's log cleaner does for a partition, with data files in place of log segments:

1. The *key map*: the latest offset of every key among the dirty records (those from
   ``dirty_start`` on, which no cleaning has seen yet), read from the key and offset columns
   of the dirty files only, one file at a time.
2. Each data file of the range, in offset order, is read and rewritten to a file over the
   same offsets holding the records that survive: a record with a key survives unless the
   map has a later offset for its key; a tombstone (null value) also goes once it is stamped
   before ``delete_horizon_ms``; a record without a key goes (Kafka's cleaner drops those);
   records of control batches stay. Records written in transactions are not compacted: they
   stay, and replace no other record (Kafka's cleaner drops aborted ones and takes committed
   ones as any other; telling them apart is left for later, and keeping them loses nothing a
   ``read_committed`` consumer should see). Offsets, batch base offsets and everything else of the
   surviving rows are unchanged, so consumers read Kafka's gaps.

Memory: the key map (each distinct dirty key once, with its offset: about the keys' bytes
plus 16 bytes a key) and one data file at a time (two while a file that kept no record waits
to join the next one's range). The planner bounds the dirty bytes of one task by
``[compactor] max_task_bytes``.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.errors import CorruptDataError
from icefloe.ports.compaction import CleanSpec, StreamRange, WrittenFile, cleaned_path
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TimePartition
from icefloe.storage.parquet import encode_data_file
from icefloe.storage.row_schema import OFFSET, ROW_SCHEMA, TIMESTAMP

CONTROL_BIT: Final = 0x20
"""A row of a control batch (a transaction marker): never removed by key."""
TRANSACTIONAL_BIT: Final = 0x10
"""A row written in a transaction: never removed, and never replaces another."""
FOLD_ROWS: Final = 1 << 20
"""Pending key rows folded into the map at once (bounds the memory of duplicates)."""


class KeyMap:
    """The latest offset of each key seen, built from ``(key, offset)`` columns."""

    def __init__(self) -> None:
        self._keys: pa.Array = pa.array([], pa.binary())
        self._offsets: pa.Array = pa.array([], pa.int64())
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def add(self, keys: pa.Array | pa.ChunkedArray, offsets: pa.Array | pa.ChunkedArray) -> None:
        """Record ``offsets`` of ``keys`` (null keys are ignored)."""
        table = pa.table({"key": keys, "offset": offsets}).filter(pc.is_valid(keys))
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= max(FOLD_ROWS, len(self._keys)):
            self._fold()

    def _fold(self) -> None:
        if not self._pending:
            return
        known = pa.table({"key": self._keys, "offset": self._offsets})
        grouped = (
            pa.concat_tables([known, *self._pending])
            .group_by("key", use_threads=False)
            .aggregate([("offset", "max")])
        )
        self._keys = grouped.column("key").combine_chunks()
        self._offsets = grouped.column("offset_max").combine_chunks()
        self._pending, self._pending_rows = [], 0

    def __len__(self) -> int:
        self._fold()
        return len(self._keys)

    def latest(self, keys: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, np.dtype[np.int64]]:
        """The latest offset of each of ``keys``, ``-1`` where the map has none (or null)."""
        self._fold()
        positions = pc.index_in(keys, value_set=self._keys)
        found = pc.take(self._offsets, positions).fill_null(-1)
        return np.asarray(found.to_numpy(zero_copy_only=False), dtype=np.int64)


def surviving(table: pa.Table, key_map: KeyMap, spec: CleanSpec) -> pa.Table:
    """The rows of ``table`` (one data file's) that log compaction keeps."""
    if table.num_rows == 0:
        return table
    keys = table.column("key")
    offsets = np.asarray(table.column(OFFSET).to_numpy(), dtype=np.int64)
    has_key = _bools(pc.is_valid(keys))
    latest_of_key = offsets >= key_map.latest(keys)
    expired = _bools(pc.is_null(table.column("value"))) & (_millis(table) < spec.delete_horizon_ms)
    attributes = np.asarray(table.column("batch_attributes").to_numpy(), dtype=np.int64)
    untouched = (attributes & (CONTROL_BIT | TRANSACTIONAL_BIT)) != 0
    keep = untouched | (has_key & latest_of_key & ~expired)
    return table.filter(pa.array(keep))


def tombstone_expiry_ms(table: pa.Table, spec: CleanSpec) -> int | None:
    """When the earliest tombstone of ``table`` not yet past the horizon may go, or ``None``
    without one. (A tombstone past it is in ``table`` only as a range's last record, which
    stays: asking to clean again for it would clean forever.)"""
    millis = _millis(table)
    tombstone = pc.and_(pc.is_null(table.column("value")), pc.is_valid(table.column("key")))
    live = _bools(tombstone) & (millis >= spec.delete_horizon_ms)
    if not live.any():
        return None
    return int(millis[live].min()) + spec.delete_retention_ms


def _millis(table: pa.Table) -> np.ndarray[Any, np.dtype[np.int64]]:
    micros = table.column(TIMESTAMP).cast(pa.int64()).to_numpy()
    return np.asarray(micros, dtype=np.int64) // 1000


def _bools(array: pa.Array | pa.ChunkedArray) -> np.ndarray[Any, np.dtype[np.bool_]]:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def read_rows(
    data: bytes | memoryview, r: StreamRange, columns: Sequence[str] | None = None
) -> pa.Table:
    """The rows of a stored data file for ``r``, checked: offsets strictly increase, all
    within ``[r.start_offset, r.end_offset)`` (a compacted file may have gaps). Without
    ``columns``, a schema-backed topic's typed columns come too, after the Kafka columns."""
    try:
        if columns is not None:
            table = pq.read_table(pa.py_buffer(data), schema=ROW_SCHEMA, columns=columns)
        else:
            table = _with_typed_columns(pq.read_table(pa.py_buffer(data)))
    except (pa.ArrowException, OSError, ValueError, KeyError) as exc:
        raise CorruptDataError(f"stream {r.stream_id}: data file {r.ref!r}: {exc}") from exc
    check_offsets(table, r)
    return table


def _with_typed_columns(table: pa.Table) -> pa.Table:
    """``table`` as :data:`ROW_SCHEMA`, then whatever other (typed) columns it has."""
    kafka = table.select(ROW_SCHEMA.names).cast(ROW_SCHEMA)
    for name in table.column_names:
        if name not in ROW_SCHEMA.names:
            kafka = kafka.append_column(table.schema.field(name), table.column(name))
    return kafka


def check_offsets(table: pa.Table, r: StreamRange) -> None:
    """Refuse a data file whose rows are not strictly increasing offsets within ``r`` (a file
    of no rows is fine: a range of transaction markers and aborted records only)."""
    offsets = np.asarray(table.column(OFFSET).to_numpy(), dtype=np.int64)
    inside = len(offsets) == 0 or (
        int(offsets[0]) >= r.start_offset
        and int(offsets[-1]) < r.end_offset
        and bool(np.all(offsets[1:] > offsets[:-1]))
    )
    if not inside:
        held = (int(offsets[0]), int(offsets[-1]) + 1) if len(offsets) else None
        raise CorruptDataError(
            f"stream {r.stream_id}: data file {r.ref!r} holds offsets {held} ({len(offsets)} "
            f"rows), not increasing offsets within [{r.start_offset}, {r.end_offset})"
        )


@dataclass
class _Output:
    start: int
    end: int
    rows: pa.Table


async def clean_stream(
    task_id: str,
    ranges: Sequence[StreamRange],
    spec: CleanSpec,
    output_path: str,
    unit: TimePartition | None,
    store: ObjectStore,
    codec: str,
) -> list[WrittenFile]:
    """Log-compact one stream's consecutive data files (``ranges``, in offset order): one
    new file per source over the same offsets, beside ``output_path``, written with
    ``codec``."""
    expected = ranges[0].start_offset
    for r in ranges:
        if r.start_offset != expected:
            raise CorruptDataError(
                f"stream {r.stream_id}: cleaning ranges leave a gap at offset {expected}"
            )
        expected = r.end_offset
    key_map = KeyMap()
    for r in ranges:
        if r.end_offset <= spec.dirty_start:
            continue
        data = await store.get(r.ref)
        pairs = await asyncio.to_thread(read_rows, data, r, ["key", OFFSET, "batch_attributes"])
        del data
        plain = pc.equal(pc.bit_wise_and(pairs.column("batch_attributes"), TRANSACTIONAL_BIT), 0)
        dirty = pairs.filter(
            pc.and_(pc.greater_equal(pairs.column(OFFSET), spec.dirty_start), plain)
        )
        key_map.add(dirty.column("key"), dirty.column(OFFSET))
    write = functools.partial(
        _write,
        task_id,
        ranges[0].stream_id,
        spec=spec,
        path=output_path,
        unit=unit,
        store=store,
        codec=codec,
    )
    written: list[WrittenFile] = []
    previous: _Output | None = None
    empty_from: int | None = None
    for i, r in enumerate(ranges):
        data = await store.get(r.ref)
        table = await asyncio.to_thread(read_rows, data, r)
        del data
        kept = await asyncio.to_thread(surviving, table, key_map, spec)
        if kept.num_rows == 0 and not (i == len(ranges) - 1 and previous is None):
            empty_from = r.start_offset if empty_from is None else empty_from
            continue
        if kept.num_rows == 0:
            kept = table.slice(max(0, table.num_rows - 1))  # nothing survives: the last stays
        start = r.start_offset if empty_from is None else empty_from
        empty_from = None
        if previous is not None:
            written.append(await write(previous))
        previous = _Output(start, r.end_offset, kept)
    assert previous is not None
    if empty_from is not None:  # the last files kept nothing: the file before takes their range
        previous.end = ranges[-1].end_offset
    written.append(await write(previous))
    return written


async def _write(
    task_id: str,
    stream_id: int,
    output: _Output,
    *,
    spec: CleanSpec,
    path: str,
    unit: TimePartition | None,
    store: ObjectStore,
    codec: str,
) -> WrittenFile:
    parquet, facts = await asyncio.to_thread(
        encode_data_file, output.rows, output.start, output.end, codec
    )
    if unit is not None:
        facts["time_bucket"] = unit.bucket(facts["min_timestamp"])
    facts["tombstone_expiry_ms"] = tombstone_expiry_ms(output.rows, spec)
    key = cleaned_path(path, stream_id, output.start, output.end, task_id)
    await store.put(key, parquet)
    return WrittenFile(task_id, stream_id, key, len(parquet), **facts)
