"""Kafka record batches to Parquet rows and back.

A data file holds one stream's records ``[start, end)`` with :data:`ROW_SCHEMA` (and, for a
schema-backed topic, typed columns after it: :mod:`icefloe.schemas.columns`). Rows keep their
batch's base offset and attributes, so the batches a consumer fetched from the WAL can be
rebuilt from the table with the same offsets, keys, values, headers and timestamps
(:mod:`icefloe.storage.rebuild`; records are re-encoded uncompressed: compression is a
transport detail the consumer decodes anyway).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.storage.records import decode_batch
from icefloe.storage.row_schema import ROW_SCHEMA, TIMESTAMP

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
log = logging.getLogger(__name__)

_COMPRESSION_BITS: Final = 0x07
_TRANSACTIONAL_BIT: Final = 0x10


@dataclass(frozen=True, slots=True)
class RowGroupRange:
    """Offsets ``[first, last]`` held by one row group of a data file."""

    first: int
    last: int


class RowBuilder:
    """Accumulates the rows of one stream's data file from its record batches.

    The values a batch shares (base offset, attributes, producer) are kept once per batch and
    repeated into their columns at the end, and the per-record values are kept column by
    column: compaction decodes every record, so the per-record Python work is kept small.
    """

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self._offsets: list[int] = []
        self._timestamps: list[int] = []
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._headers: list[tuple[tuple[str, bytes | None], ...]] = []
        self._batches: list[tuple[int, int, int, int, int, int, int]] = []
        """Per batch: (records, base offset, attributes, timestamp type, producer id,
        producer epoch, base sequence)."""

    def add_batch(
        self, batch: bytes | memoryview, base_offset: int, *, committed: bool = False
    ) -> None:
        """Decode one batch whose first record has offset ``base_offset``.

        ``committed``: the batch belongs to a committed transaction; its rows keep no
        transactional bit, so it reads back as a plain batch (its markers are not kept, and a
        read_committed consumer needs none for it).
        """
        header, records = decode_batch(batch, base_offset=base_offset)
        if not records:
            return
        attributes = header.attributes & ~_COMPRESSION_BITS
        if committed:
            attributes &= ~_TRANSACTIONAL_BIT
        offsets, timestamps, keys, values, headers = zip(*records, strict=True)
        self._offsets += offsets
        self._timestamps += timestamps
        self._keys += keys
        self._values += values
        self._headers += headers
        self._batches.append(
            (
                len(records),
                base_offset,
                attributes,
                int(header.timestamp_type),
                header.producer_id,
                header.producer_epoch,
                header.base_sequence,
            )
        )

    @property
    def rows(self) -> int:
        return len(self._offsets)

    def table(self) -> pa.Table:
        rows = self.rows
        per_batch = np.array(self._batches, dtype=np.int64).reshape(-1, 7)
        counts = per_batch[:, 0]

        def repeated(column: int) -> npt.NDArray[np.int64]:
            return np.repeat(per_batch[:, column], counts)

        columns = {
            "partition": np.full(rows, self.partition, dtype=np.int32),
            "offset": np.array(self._offsets, dtype=np.int64),
            "timestamp": np.array(self._timestamps, dtype=np.int64) * 1000,  # ms → µs
            "timestamp_type": repeated(3),
            "key": self._keys,
            "value": self._values,
            "batch_base_offset": repeated(1),
            "batch_attributes": repeated(2),
            "producer_id": repeated(4),
            "producer_epoch": repeated(5),
            "base_sequence": repeated(6),
        }
        arrays = {
            name: pa.array(values, type=ROW_SCHEMA.field(name).type)
            for name, values in columns.items()
        }
        arrays["headers"] = _header_lists(self._headers)
        return pa.Table.from_arrays([arrays[name] for name in ROW_SCHEMA.names], schema=ROW_SCHEMA)


_HEADERS_TYPE: Final = ROW_SCHEMA.field("headers").type


def _header_lists(headers: list[tuple[tuple[str, bytes | None], ...]]) -> pa.Array:
    """The headers column, built from flat lists of keys and values and each row's count."""
    bounds = np.zeros(len(headers) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, headers), dtype=np.int32, count=len(headers)), out=bounds[1:])
    flat = [header for row in headers for header in row]
    entries = pa.StructArray.from_arrays(
        [
            _header_keys([key for key, _ in flat]),
            pa.array([value for _, value in flat], type=pa.binary()),
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


def encode_parquet(table: pa.Table) -> tuple[bytes, tuple[RowGroupRange, ...]]:
    """The Parquet bytes of ``table`` (zstd, offset-sized row groups) and its row-group map.

    Row groups never split a batch, so a fetch that starts at a batch boundary reads whole
    row groups only.
    """
    rows_per_group = _rows_per_group(table)
    sink = io.BytesIO()
    with pq.ParquetWriter(
        sink,
        table.schema,  # ROW_SCHEMA, and a schema-backed topic's typed columns after it
        compression="zstd",
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
    table: pa.Table, start_offset: int, end_offset: int
) -> tuple[bytes, dict[str, Any]]:
    """One data file of ``table`` (rows of a stream in offset order) covering
    ``[start_offset, end_offset)``, and its facts (the fields of a ``WrittenFile``).

    The range may hold more offsets than rows: log compaction leaves gaps, transaction markers
    and aborted transactions leave gaps, and a file's range is what the offset index holds, not
    its first and last rows. A range of markers and aborted records only is a file of no rows
    (its timestamps -1, as Kafka answers "no timestamp").
    """
    data, groups = encode_parquet(table)
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


def encode_dead_letters(table: pa.Table) -> bytes:
    """A dead-letter table's data file: zstd, statistics on partition and offset, no Arrow
    metadata (Iceberg and Delta read the Parquet schema)."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        write_statistics=["partition", "offset"],
        store_schema=False,
    )
    return sink.getvalue()


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
