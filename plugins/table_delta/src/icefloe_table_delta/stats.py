"""Delta ``stats`` JSON for an existing Parquet file, from its footer alone.

Delta readers skip files by these statistics (``numRecords`` also answers ``count(*)``
without reading data). They are computed from the footer's row-group statistics, so adding a
file costs one ranged read of its tail, never a scan. Only top-level integer and timestamp
columns get min/max (Delta does not use binary min/max; nested columns are left out).
"""

from __future__ import annotations

import datetime
import json
import struct
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

TAIL_BYTES: Final = 64 << 10
"""Bytes read from the end of a file first; footers of Icefloe's files are far smaller."""
_MAGIC: Final = b"PAR1"
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def footer_length(tail: bytes) -> int:
    """Length of the footer (metadata) from the last 8 bytes of a Parquet file."""
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        raise ValueError("not a Parquet file (no PAR1 magic at its end)")
    (length,) = struct.unpack("<I", tail[-8:-4])
    return int(length)


def read_footer(tail: bytes) -> pq.FileMetaData:
    """Parse the footer from the file's last ``footer_length + 8`` (or more) bytes."""
    length = footer_length(tail)
    if len(tail) < length + 8:
        raise ValueError("the tail holds only part of the footer")
    # A magic prefix makes the tail look like a (data-less) Parquet file to the reader.
    return pq.read_metadata(pa.BufferReader(_MAGIC + tail[-(length + 8) :]))


def stats_json(metadata: pq.FileMetaData) -> str:
    """The Delta ``stats`` string (numRecords, minValues, maxValues, nullCount)."""
    schema = metadata.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    groups = _row_groups(metadata)
    for name in schema.names:
        arrow_type = schema.field(name).type
        column = _column_index(metadata, name)
        if column is None:
            continue  # nested: no single leaf column
        chunks = _statistics(groups, column)
        if not chunks:
            continue
        if all(s.has_null_count for s in chunks):
            nulls[name] = sum(int(s.null_count) for s in chunks)
        if not (pa.types.is_integer(arrow_type) or pa.types.is_timestamp(arrow_type)):
            continue
        if not all(s.has_min_max for s in chunks):
            continue
        if pa.types.is_timestamp(arrow_type):
            span = _nanos_range(chunks, arrow_type)
            if span is None:
                continue
            mins[name], maxes[name] = _millis(span[0], up=False), _millis(span[1], up=True)
        elif pa.types.is_signed_integer(arrow_type):  # stored as they are
            mins[name] = min(s.min_raw for s in chunks)
            maxes[name] = max(s.max_raw for s in chunks)
        else:
            mins[name] = int(min(s.min for s in chunks))
            maxes[name] = int(max(s.max for s in chunks))
    stats = {
        "numRecords": metadata.num_rows,
        "minValues": mins,
        "maxValues": maxes,
        "nullCount": nulls,
    }
    return json.dumps(stats, separators=(",", ":"))


def timestamp_range_ms(metadata: pq.FileMetaData, name: str) -> tuple[int, int] | None:
    """(min, max) of the timestamp column ``name`` in milliseconds, from the row groups'
    statistics; ``None`` if a row group has none."""
    column = _column_index(metadata, name)
    if column is None:
        return None
    arrow_type = metadata.schema.to_arrow_schema().field(name).type
    chunks = _statistics(_row_groups(metadata), column)
    if not chunks or not all(s.has_min_max for s in chunks):
        return None
    span = _nanos_range(chunks, arrow_type)
    if span is None:
        return None
    return span[0] // 1_000_000, span[1] // 1_000_000


def _row_groups(metadata: pq.FileMetaData) -> list[pq.RowGroupMetaData]:
    return [metadata.row_group(g) for g in range(metadata.num_row_groups)]


def _statistics(groups: list[pq.RowGroupMetaData], column: int) -> list[pq.Statistics]:
    """The statistics of ``column`` in every row group; empty if a group has none.

    Most of Icefloe's columns carry none: stopping at the first group that has none keeps a
    file of a hundred groups from costing a wrapper object per group and column.
    """
    chunks = []
    for group in groups:
        statistics = group.column(column).statistics
        if statistics is None:
            return []
        chunks.append(statistics)
    return chunks


_NANOS_PER: Final = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def _nanos_range(chunks: list[pq.Statistics], arrow_type: pa.DataType) -> tuple[int, int] | None:
    """(min, max) nanoseconds since the epoch of a timestamp column, from the statistics'
    stored integers (a ``datetime`` per group costs ten times more, and drops nanoseconds);
    ``None`` if they are not 64-bit integers (legacy INT96 timestamps)."""
    if chunks[0].physical_type != "INT64":
        return None
    scale = _NANOS_PER[arrow_type.unit]
    return min(s.min_raw for s in chunks) * scale, max(s.max_raw for s in chunks) * scale


def _column_index(metadata: pq.FileMetaData, name: str) -> int | None:
    for i in range(metadata.num_columns):
        if metadata.schema.column(i).path == name:
            return i
    return None


def _millis(nanos: int, *, up: bool) -> str:
    """A Delta stats timestamp: ISO-8601 with milliseconds, in UTC.

    Delta keeps milliseconds only; the maximum is rounded *up* so that a reader skipping files
    by ``max < x`` never skips one holding a row in the last, truncated millisecond.
    """
    millis = -(-nanos // 1_000_000) if up else nanos // 1_000_000
    value = _EPOCH + datetime.timedelta(milliseconds=millis)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
