"""Reading chosen row groups of a Parquet file through the ObjectStore port."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from icefloe.config import load_config, resolve_one
from icefloe.errors import CorruptDataError
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import ObjectStore, RequestKind
from icefloe.storage.parquet import RowBuilder, encode_parquet
from icefloe.storage.parquet_reader import KAFKA_COLUMNS, ParquetRangeReader
from icefloe.storage.records import Record, build_batch


def many_row_groups() -> bytes:
    """A file of a few MB with incompressible values: many row groups, a large footer gap."""
    builder = RowBuilder(0)
    offset = 0
    for _ in range(300):
        records = [Record(offset + i, 1_700_000_000_000, None, os.urandom(1024)) for i in range(16)]
        builder.add_batch(build_batch(records, base_offset=offset), offset)
        offset += 16
    data, groups = encode_parquet(builder.table())
    assert len(groups) > 3
    return data


async def open_store(tmp_path: Path) -> ObjectStore:
    config = load_config(env={}, overrides={"data_dir": str(tmp_path)})
    store = await resolve_one(config, ObjectStore).open(OpenContext(tmp_path))
    assert isinstance(store, ObjectStore)
    return store


async def test_every_row_group_reads_back_as_pyarrow_reads_it(tmp_path: Path) -> None:
    data = many_row_groups()
    store = await open_store(tmp_path)
    await store.put("f.parquet", data)
    reader = ParquetRangeReader(store)
    whole = pq.ParquetFile(io.BytesIO(data))
    for group in range(whole.metadata.num_row_groups):
        got = (await reader.fetch("f.parquet", len(data), [group])).decode()
        assert got.equals(whole.read_row_group(group, columns=KAFKA_COLUMNS))
        assert "partition" not in got.column_names  # one per file: nothing to rebuild from
    last = whole.metadata.num_row_groups - 1
    both = (await reader.fetch("f.parquet", len(data), [0, last])).decode()
    assert both.num_rows == whole.read_row_groups([0, last]).num_rows
    # Adjacent groups: pyarrow reads across the partition column's chunk between them.
    adjacent = (await reader.fetch("f.parquet", len(data), [1, 2])).decode()
    assert adjacent.equals(whole.read_row_groups([1, 2], columns=KAFKA_COLUMNS))
    await store.close()


async def test_reading_one_row_group_fetches_only_its_bytes(tmp_path: Path) -> None:
    data = many_row_groups()
    store = await open_store(tmp_path)
    await store.put("f.parquet", data)
    reader = ParquetRangeReader(store)
    await reader.fetch("f.parquet", len(data), [0])  # footer now cached
    fetched = store.stats.bytes[RequestKind.GET]
    await reader.fetch("f.parquet", len(data), [1])
    size = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(1).total_byte_size
    assert store.stats.bytes[RequestKind.GET] - fetched < 2 * size
    assert store.stats.bytes[RequestKind.GET] - fetched < len(data) / 2
    await store.close()


@pytest.mark.parametrize(
    "data",
    [b"", b"PAR1", b"PAR1" + b"\0" * 8 + b"PAR1", b"PAR1\xff\xff\xff\x7fPAR1"],
    ids=["empty", "shorter than a footer", "footer of 0 bytes", "footer longer than the file"],
)
async def test_a_file_that_cannot_hold_its_footer_is_corrupt(tmp_path: Path, data: bytes) -> None:
    store = await open_store(tmp_path)
    await store.put("f.parquet", data)
    try:
        with pytest.raises(CorruptDataError, match=r"f\.parquet"):
            await ParquetRangeReader(store).metadata("f.parquet", len(data))
    finally:
        await store.close()


def test_unique_values_are_written_plain_and_keys_and_headers_with_a_dictionary() -> None:
    builder = RowBuilder(0)
    records = [
        Record(i, 1_700_000_000_000, b"key-%d" % (i % 3), os.urandom(64), (("type", b"order"),))
        for i in range(100)
    ]
    builder.add_batch(build_batch(records, base_offset=0), 0)
    data, _ = encode_parquet(builder.table())
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema: group.column(i).encodings for i in range(13)}
    for path in ("value", "offset", "timestamp"):
        assert "RLE_DICTIONARY" not in encodings[path], path
    for path in ("key", "headers.list.element.key", "headers.list.element.value"):
        assert "RLE_DICTIONARY" in encodings[path], path


def test_columns_of_runs_are_left_uncompressed_and_take_a_few_bytes() -> None:
    builder = RowBuilder(0)
    for n in range(50):
        records = [Record(10 * n + i, 1_700_000_000_000, b"k", b"v" * 100) for i in range(10)]
        builder.add_batch(build_batch(records, base_offset=10 * n, producer_id=7), 10 * n)
    data, _ = encode_parquet(builder.table())
    group = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0)
    columns = {group.column(i).path_in_schema: group.column(i) for i in range(13)}
    runs = ("partition", "timestamp_type", "batch_attributes", "producer_id", "producer_epoch")
    for path in (*runs, "base_sequence", "batch_base_offset"):
        assert columns[path].compression == "UNCOMPRESSED", path
    for path in runs:  # one value for the whole file: a dictionary of one and a run
        assert columns[path].total_compressed_size < 100, path
    for path in ("offset", "timestamp", "key", "value", "headers.list.element.key"):
        assert columns[path].compression == "ZSTD", path
