"""Kafka record batches to Parquet rows and back.

A data file holds one stream's records ``[start, end)`` with :data:`ROW_SCHEMA` (and, for a
schema-backed topic, typed columns after it: :mod:`icefloe.schemas.columns`). Rows keep their
batch's base offset and attributes, so the batches a consumer fetched from the WAL can be
rebuilt from the table with the same offsets, keys, values, headers and timestamps
(:mod:`icefloe.storage.rebuild`; records are re-encoded uncompressed: compression is a
transport detail the consumer decodes anyway).
"""

from __future__ import annotations

import functools
import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from kio.schema.errors import ErrorCode

from icefloe.config.compactor import TableCodec
from icefloe.storage.batch import BatchError, TimestampType
from icefloe.storage.record_columns import PADDING, decode_fields
from icefloe.storage.records import Header, batch_records, record_bounds
from icefloe.storage.row_schema import OFFSET, PARTITION, ROW_SCHEMA, TIMESTAMP

CODECS: Final = tuple(codec.value for codec in TableCodec)
"""The codecs a data file's record columns may be written with."""
DEFAULT_CODEC: Final = TableCodec.ZSTD.value
ROW_GROUP_BYTES: Final = 1 << 20
"""Target uncompressed size of a row group: about what one fetch of a partition returns."""
STATISTICS_COLUMNS: Final = [
    "partition",
    "offset",
    "timestamp",
    "batch_base_offset",
    "key_error",
    "value_error",
]
"""Columns with Parquet statistics (a missing one is skipped): what readers filter on, and the
typed columns' error columns, whose null counts are the dead letters of a file."""
NO_DICTIONARY_COLUMNS: Final = frozenset({"value", OFFSET, TIMESTAMP})
"""Columns written without dictionary encoding. Offsets and timestamps are (nearly) unique
per row, and record values rarely repeat, so their dictionaries would hold nearly every
value: a row group would be written as a dictionary plus indices (hashing every value) and
read back through a gather copy. Keys and headers keep it: they often repeat (a compacted
topic's keys, header names)."""
UNCOMPRESSED_COLUMNS: Final = frozenset(
    {
        PARTITION,
        "timestamp_type",
        "batch_base_offset",
        "batch_attributes",
        "producer_id",
        "producer_epoch",
        "base_sequence",
    }
)
"""Columns written uncompressed whatever the codec: their values come in runs (one per file or
per batch), which dictionary and run-length encoding already shrink to a few bytes a page, and
decompressing each of those pages costs a catch-up read more than their bytes (about 30 % of a
row group's decode time for 1 KiB records)."""
log = logging.getLogger(__name__)

_COMPRESSION_BITS: Final = 0x07
_TRANSACTIONAL_BIT: Final = 0x10


@dataclass(frozen=True, slots=True)
class RowGroupRange:
    """Offsets ``[first, last]`` held by one row group of a data file."""

    first: int
    last: int


# What RowBuilder keeps per batch, by position in its tuple.
_COUNT, _BASE_OFFSET, _ATTRIBUTES, _TIMESTAMP_TYPE, _PRODUCER_ID, _PRODUCER_EPOCH = range(6)
_BASE_SEQUENCE, _FIRST_MILLIS, _DELTAS_COUNT, _SHIFT, _LAST_DELTA = range(6, 11)

SEGMENT_BYTES: Final = 16 << 20
"""Record bytes decoded together into one chunk of the table. Small enough that the segment's
bytes and the fields decoded from them stay in the processor's cache from one pass over them to
the next (the join, a pass per field, the copies into Arrow): segments of 256 MiB took about
twice as long to decode as these. It bounds numpy's temporaries too."""


class RowBuilder:
    """Accumulates the rows of one stream's data file from its record batches.

    Batches are checked (and decompressed) as they are added, and their records' bytes kept;
    the fields of all records are decoded together when the table is built
    (:mod:`icefloe.storage.record_columns`), and the values a batch shares (base offset,
    attributes, producer) are repeated into their columns with numpy.
    """

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self._segments: list[_Segment] = [_Segment()]
        self._rows = 0

    def add_batch(
        self, batch: bytes | memoryview, base_offset: int, *, committed: bool = False
    ) -> None:
        """Add one batch whose first record has offset ``base_offset``.

        ``committed``: the batch belongs to a committed transaction; its rows keep no
        transactional bit, so it reads back as a plain batch (its markers are not kept, and a
        read_committed consumer needs none for it).

        Raises:
            BatchError: the batch is not valid; its records' fields are checked by
                :meth:`table`.
        """
        header, data, start = batch_records(batch)
        bounds = record_bounds(data, start, header.record_count)
        if not bounds:
            return
        records = memoryview(data)[start:]
        segment = self._segments[-1]
        if segment.size and segment.size + len(records) > SEGMENT_BYTES:
            segment = _Segment()
            self._segments.append(segment)
        attributes = header.attributes & ~_COMPRESSION_BITS
        if committed:
            attributes &= ~_TRANSACTIONAL_BIT
        log_append_time = header.timestamp_type == TimestampType.LOG_APPEND_TIME
        count = len(bounds) // 2
        segment.batches.append(
            (
                count,
                base_offset,
                attributes,
                int(header.timestamp_type),
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
                header.max_timestamp if log_append_time else header.base_timestamp,
                0 if log_append_time else 1,  # whether record timestamp deltas count
                segment.size - start,  # from a position in ``data`` to one in the segment
                header.last_offset_delta,
            )
        )
        segment.bounds += bounds
        segment.pieces.append(records)
        segment.size += len(records)
        self._rows += count

    @property
    def rows(self) -> int:
        return self._rows

    def table(self) -> pa.Table:
        """The rows added so far.

        Raises:
            BatchError: a record's fields do not fit its length.
        """
        tables = [self._segment_table(segment) for segment in self._segments if segment.batches]
        if not tables:
            return ROW_SCHEMA.empty_table()
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def _segment_table(self, segment: _Segment) -> pa.Table:
        per_batch = np.array(segment.batches, dtype=np.int64)
        counts = per_batch[:, _COUNT]

        def repeated(column: int) -> npt.NDArray[np.int64]:
            return np.repeat(per_batch[:, column], counts)

        bounds = np.array(segment.bounds, dtype=np.int64).reshape(-1, 2) + repeated(_SHIFT)[:, None]
        fields = decode_fields(
            b"".join([*segment.pieces, PADDING]), bounds[:, 0].copy(), bounds[:, 1].copy()
        )
        millis = repeated(_FIRST_MILLIS) + fields.timestamp_deltas * repeated(_DELTAS_COUNT)
        columns = {
            "partition": np.full(len(bounds), self.partition, dtype=np.int32),
            "offset": repeated(_BASE_OFFSET)
            + _offset_deltas(fields.offset_deltas, counts, per_batch[:, _LAST_DELTA]),
            "timestamp": millis * 1000,  # ms → µs
            "timestamp_type": repeated(_TIMESTAMP_TYPE),
            "batch_base_offset": repeated(_BASE_OFFSET),
            "batch_attributes": repeated(_ATTRIBUTES),
            "producer_id": repeated(_PRODUCER_ID),
            "producer_epoch": repeated(_PRODUCER_EPOCH),
            "base_sequence": repeated(_BASE_SEQUENCE),
        }
        arrays = {
            name: pa.array(values, type=ROW_SCHEMA.field(name).type)
            for name, values in columns.items()
        }
        arrays["key"] = fields.keys
        arrays["value"] = fields.values
        arrays["headers"] = _header_lists(fields.header_counts, fields.headers)
        return pa.Table.from_arrays([arrays[name] for name in ROW_SCHEMA.names], schema=ROW_SCHEMA)


@dataclass(slots=True)
class _Segment:
    """Batches whose records are decoded together: their records' bytes, each record's bounds
    in its batch's bytes, and the per-batch values :meth:`RowBuilder.add_batch` keeps."""

    pieces: list[memoryview] = field(default_factory=list)
    size: int = 0
    bounds: list[int] = field(default_factory=list)
    batches: list[tuple[int, ...]] = field(default_factory=list)


def _offset_deltas(
    deltas: npt.NDArray[np.int64], counts: npt.NDArray[np.int64], last_deltas: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """Each record's offset delta within its batch: the one written, unless a batch's deltas do
    not increase strictly within ``[0, lastOffsetDelta]``; then its records' positions.

    Producers write 0, 1, 2, …, and log compaction leaves gaps between those. Deltas that go
    back, repeat or reach past the batch can only come from a hostile client (the produce path
    checks batch headers, not records, and Kafka leaves such deltas as sent too): taken as
    written they would give table rows other batches' offsets, and the batch rebuilt from
    them a negative ``lastOffsetDelta``, which holds a consumer at its offset for good. The
    WAL serves such a batch as it was sent, as Kafka does.

    Raises:
        BatchError: a batch holds more records than offsets (``CORRUPT_MESSAGE``; the produce
            path refuses such a batch, so only bytes changed in storage hold one).
    """
    firsts = np.cumsum(counts) - counts
    positions = np.arange(len(deltas)) - np.repeat(firsts, counts)
    wrong = (deltas < 0) | (deltas > np.repeat(last_deltas, counts))
    wrong[1:] |= (deltas[1:] <= deltas[:-1]) & (positions[1:] > 0)
    if not wrong.any():
        return deltas
    wrong_batches = np.zeros(len(counts), dtype=bool)
    wrong_batches[np.repeat(np.arange(len(counts)), counts)[wrong]] = True
    if (counts[wrong_batches] > last_deltas[wrong_batches] + 1).any():
        raise BatchError(ErrorCode.corrupt_message, "a record batch has more records than offsets")
    return np.where(np.repeat(wrong_batches, counts), positions, deltas)


_HEADERS_TYPE: Final = ROW_SCHEMA.field("headers").type


def _header_lists(counts: npt.NDArray[np.int64], headers: list[Header]) -> pa.Array:
    """The headers column, from each row's header count and every row's headers in order."""
    bounds = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=bounds[1:])
    entries = pa.StructArray.from_arrays(
        [
            _header_keys([key for key, _ in headers]),
            pa.array([value for _, value in headers], type=pa.binary()),
        ],
        fields=list(_HEADERS_TYPE.value_type),
    )
    return pa.ListArray.from_arrays(pa.array(bounds), entries, type=_HEADERS_TYPE)


def _header_keys(keys: list[str]) -> pa.Array:
    """The header keys as a string column, each invalid UTF-8 byte replaced by U+FFFD.

    Kafka's protocol makes a header key a UTF-8 string, but its broker never checks, and a
    client other than Java's can send any bytes (records.py keeps them as lone surrogates). A
    table column must hold valid UTF-8, and failing here would fail the run on every retry and
    leave the stream's WAL uncompacted for good: such a key is stored replaced, which is what
    Kafka's Java consumer shows for it anyway. It is the one case where a consumer reads
    different bytes from Parquet than from the WAL.
    """
    try:
        return pa.array(keys, type=pa.string())
    except UnicodeEncodeError:
        replaced = [_valid_utf8(key) for key in keys]
        changed = sum(old != new for old, new in zip(keys, replaced, strict=True))
        log.warning(
            "%d record header key(s) are not valid UTF-8: stored with U+FFFD in their place",
            changed,
        )
        return pa.array(replaced, type=pa.string())


def _valid_utf8(key: str) -> str:
    return key.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def encode_parquet(
    table: pa.Table, codec: str = DEFAULT_CODEC
) -> tuple[bytes, tuple[RowGroupRange, ...]]:
    """The Parquet bytes of ``table`` (``codec``, offset-sized row groups) and its row-group
    map.

    Row groups never split a batch, so a fetch that starts at a batch boundary reads whole
    row groups only.
    """
    rows_per_group = _rows_per_group(table)
    sink = io.BytesIO()
    with pq.ParquetWriter(
        sink,
        table.schema,  # ROW_SCHEMA, and a schema-backed topic's typed columns after it
        compression=_compression(table.schema, codec),
        use_dictionary=_dictionary_columns(table.schema),
        write_statistics=STATISTICS_COLUMNS,
        store_schema=False,  # no Arrow metadata: Iceberg and Delta read the Parquet schema
    ) as writer:
        for chunk in _batch_aligned_slices(table, rows_per_group):
            writer.write_table(chunk, row_group_size=chunk.num_rows)
    data = sink.getvalue()
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    offset_index = _leaf_index(metadata, "offset")
    ranges = []
    for i in range(metadata.num_row_groups):
        stats = metadata.row_group(i).column(offset_index).statistics
        ranges.append(RowGroupRange(int(stats.min), int(stats.max)))
    return data, tuple(ranges)


def encode_data_file(
    table: pa.Table, start_offset: int, end_offset: int, codec: str = DEFAULT_CODEC
) -> tuple[bytes, dict[str, Any]]:
    """One data file of ``table`` (rows of a stream in offset order) covering
    ``[start_offset, end_offset)``, its columns compressed with ``codec`` (one of
    :data:`CODECS`), and its facts (the fields of a ``WrittenFile``).

    The range may hold more offsets than rows: log compaction leaves gaps, transaction markers
    and aborted transactions leave gaps, and a file's range is what the offset index holds, not
    its first and last rows. A range of markers and aborted records only is a file of no rows
    (its timestamps -1, as Kafka answers "no timestamp").
    """
    data, groups = encode_parquet(table, codec)
    timestamps = pc.min_max(table.column(TIMESTAMP).cast(pa.int64()))
    least, most = timestamps["min"].as_py(), timestamps["max"].as_py()
    facts = {
        "record_count": table.num_rows,
        "start_offset": start_offset,
        "end_offset": end_offset,
        "row_groups": tuple((g.first, g.last) for g in groups),
        "min_timestamp": -1 if least is None else least // 1000,  # µs → ms
        "max_timestamp": -1 if most is None else most // 1000,
    }
    return data, facts


def encode_dead_letters(table: pa.Table, codec: str) -> bytes:
    """A dead-letter table's data file: ``codec``, statistics on partition and offset, no
    Arrow metadata (Iceberg and Delta read the Parquet schema)."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression=codec,
        write_statistics=["partition", "offset"],
        store_schema=False,
    )
    return sink.getvalue()


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The Parquet leaf column paths of ``schema`` (``headers.list.element.key``): what the
    writer's per-column options are keyed by."""
    sink = io.BytesIO()
    pq.write_table(schema.empty_table(), sink, store_schema=False)
    parquet_schema = pq.ParquetFile(io.BytesIO(sink.getvalue())).schema
    return tuple(parquet_schema.column(i).path for i in range(len(parquet_schema)))


def _dictionary_columns(schema: pa.Schema) -> list[str]:
    """The leaf columns of ``schema`` to dictionary-encode: all but
    :data:`NO_DICTIONARY_COLUMNS`."""
    return [path for path in _leaf_paths(schema) if path not in NO_DICTIONARY_COLUMNS]


def _compression(schema: pa.Schema, codec: str) -> dict[str, str]:
    """Each leaf column's codec: ``codec``, but none for :data:`UNCOMPRESSED_COLUMNS`."""
    if codec not in CODECS:
        raise ValueError(f"unknown Parquet codec {codec!r}; one of {', '.join(CODECS)}")
    return {path: "none" if path in UNCOMPRESSED_COLUMNS else codec for path in _leaf_paths(schema)}


def _leaf_index(metadata: pq.FileMetaData, name: str) -> int:
    """The index of the top-level column ``name`` among the file's leaf columns."""
    for i in range(metadata.num_columns):
        if metadata.schema.column(i).path == name:
            return i
    raise ValueError(f"no column {name!r}")


def _rows_per_group(table: pa.Table) -> int:
    if table.num_rows == 0:
        return 1
    average = max(1, int(table.nbytes) // int(table.num_rows))
    return max(1, ROW_GROUP_BYTES // average)


def _batch_aligned_slices(table: pa.Table, rows: int) -> Iterable[pa.Table]:
    """Slices of about ``rows`` rows that end on a batch boundary."""
    bases = table.column("batch_base_offset").to_pylist()
    start = 0
    while start < table.num_rows:
        end = min(start + rows, table.num_rows)
        while end < table.num_rows and bases[end] == bases[end - 1]:
            end += 1
        yield table.slice(start, end - start)
        start = end
