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
    for name in schema.names:
        arrow_type = schema.field(name).type
        column = _column_index(metadata, name)
        if column is None:
            continue  # nested: no single leaf column
        chunks = [
            metadata.row_group(g).column(column).statistics for g in range(metadata.num_row_groups)
        ]
        if not chunks or any(s is None for s in chunks):
            continue
        if all(s.has_null_count for s in chunks):
            nulls[name] = sum(int(s.null_count) for s in chunks)
        if not (pa.types.is_integer(arrow_type) or pa.types.is_timestamp(arrow_type)):
            continue
        if not all(s.has_min_max for s in chunks):
            continue
        low = min(s.min for s in chunks)
        high = max(s.max for s in chunks)
        if pa.types.is_timestamp(arrow_type):
            mins[name], maxes[name] = _millis(low, up=False), _millis(high, up=True)
        else:
            mins[name], maxes[name] = int(low), int(high)
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
    if column is None or metadata.num_row_groups == 0:
        return None
    chunks = [
        metadata.row_group(g).column(column).statistics for g in range(metadata.num_row_groups)
    ]
    if any(s is None or not s.has_min_max for s in chunks):
        return None
    low = min(s.min for s in chunks)
    high = max(s.max for s in chunks)
    return _epoch_ms(low), _epoch_ms(high)


def _epoch_ms(value: datetime.datetime) -> int:
    delta = value.astimezone(datetime.UTC) - datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    return delta // datetime.timedelta(milliseconds=1)


def _column_index(metadata: pq.FileMetaData, name: str) -> int | None:
    for i in range(metadata.num_columns):
        if metadata.schema.column(i).path == name:
            return i
    return None


def _millis(value: datetime.datetime, *, up: bool) -> str:
    """A Delta stats timestamp: ISO-8601 with milliseconds, in UTC.

    Delta keeps milliseconds only; the maximum is rounded *up* so that a reader skipping files
    by ``max < x`` never skips one holding a row in the last, truncated millisecond.
    """
    value = value.astimezone(datetime.UTC)
    if up and value.microsecond % 1000:
        value += datetime.timedelta(microseconds=1000 - value.microsecond % 1000)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
