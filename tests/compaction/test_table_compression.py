"""The codec of a topic's data files: ``icefloe.table.compression`` over ``[compactor]
table_compression``. Compaction, merges and log compaction write the topic's codec, the files
keep it, and Kafka reads, pyiceberg and delta-rs read every codec."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefloe.compaction.committer import _decode_task, _encode_task
from icefloe.compaction.service import Compactor
from icefloe.ports.compaction import CompactionTask
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.parquet import UNCOMPRESSED_COLUMNS, encode_data_file
from icefloe.storage.records import Record
from icefloe.storage.row_schema import ROW_SCHEMA
from icefloe.tables import layout
from icefloe.topics.configs import (
    REWRITE_MIN_FILES_CONFIG,
    TABLE_COMPRESSION_CONFIG,
    VALUE_SCHEMA_CONFIG,
)
from icefloe.topics.registry import Topic
from tests.compaction.conftest import Parts, opened_parts, table_config
from tests.compaction.test_log_compaction import produce_updates
from tests.compaction.test_saga_crashes import table_rows
from tests.compaction.test_typed_columns import V1, encoded, order, register
from tests.contract.test_table_delta import delta_rows
from tests.contract.test_table_iceberg import pyiceberg_table

RECORD_COLUMNS = ("offset", "timestamp", "key", "value")


@pytest.fixture
async def gzip_parts(tmp_path: Path) -> AsyncIterator[Parts]:
    """Both table formats, gzip as the broker-wide codec."""
    config = table_config(tmp_path, compactor={"table_compression": "gzip"})
    async with opened_parts(config) as opened:
        yield opened


def codecs_of(data: bytes) -> dict[str, set[str]]:
    """Each column's codecs over the row groups of a Parquet file."""
    metadata = pq.ParquetFile(pa.py_buffer(data)).metadata
    found: dict[str, set[str]] = {}
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            column = group.column(c)
            found.setdefault(column.path_in_schema, set()).add(column.compression)
    return found


async def file_codecs(compactor: Compactor, topic: str) -> list[set[str]]:
    """The codecs of the record columns of each data file in ``topic``'s Iceberg table, in
    offset order; the columns of per-batch runs must be uncompressed in each."""
    spec = compactor.committer.table_spec(topic)
    files = await compactor.table_formats["iceberg"].files(spec)
    store = compactor.storage.object_store
    root = layout.table_root(topic)
    found = []
    for file in sorted(files, key=lambda f: (f.partition, f.path)):  # names start at offsets
        codecs = codecs_of(await store.get(f"{root}/{file.path}"))
        runs = {codecs[c] == {"UNCOMPRESSED"} for c in UNCOMPRESSED_COLUMNS if c in codecs}
        assert runs == {True}, codecs
        found.append(set().union(*(codecs[c] for c in RECORD_COLUMNS)))
    return found


async def fill(storage: StreamStorage, topic: Topic, start: int, count: int) -> None:
    values = [b"v%d" % (start + i) * 50 for i in range(count)]
    records = [Record(0, 1_700_000_000_000 + i, None, v) for i, v in enumerate(values)]
    await storage.append(topic.streams[0], records)


async def read_values(storage: StreamStorage, topic: Topic) -> list[bytes]:
    return [r.value or b"" for r in await storage.read_records(topic.streams[0], 0, 1 << 24)]


def test_a_data_file_takes_the_codec_except_in_its_run_columns() -> None:
    row = {
        "partition": 0,
        "timestamp": 1_700_000_000_000_000,
        "timestamp_type": 0,
        "key": b"k",
        "headers": [],
        "batch_base_offset": 0,
        "batch_attributes": 0,
        "producer_id": -1,
        "producer_epoch": -1,
        "base_sequence": -1,
    }
    rows = pa.Table.from_pylist(
        [row | {"offset": i, "value": b"x" * 100} for i in range(100)], schema=ROW_SCHEMA
    )
    for codec, name in (("snappy", "SNAPPY"), ("gzip", "GZIP"), ("none", "UNCOMPRESSED")):
        data, _ = encode_data_file(rows, 0, 100, codec)
        codecs = codecs_of(data)
        assert {c: codecs[c] for c in RECORD_COLUMNS} == {c: {name} for c in RECORD_COLUMNS}
        assert all(codecs[c] == {"UNCOMPRESSED"} for c in UNCOMPRESSED_COLUMNS)
    with pytest.raises(ValueError, match="unknown Parquet codec 'lz5'; one of zstd, snappy"):
        encode_data_file(rows, 0, 100, "lz5")


async def test_a_topic_codec_reaches_its_files_and_every_reader(table_parts: Parts) -> None:
    storage, topics, compactor = table_parts
    topic = await topics.create("snappy-topic", 1, {TABLE_COMPRESSION_CONFIG: "snappy"})
    plain = await topics.create("plain-topic", 1)
    for t in (topic, plain):
        await fill(storage, t, 0, 200)
    before = await read_values(storage, topic)

    await compactor.until_idle()

    assert await file_codecs(compactor, "snappy-topic") == [{"SNAPPY"}]
    assert await file_codecs(compactor, "plain-topic") == [{"ZSTD"}]  # the default
    assert await read_values(storage, topic) == before  # Kafka reads, now from Parquet
    assert [e.in_wal for e in await storage.index.scan(topic.streams[0])] == [False]
    spec = compactor.committer.table_spec("snappy-topic")
    iceberg = pyiceberg_table(compactor.table_formats["iceberg"], spec).scan().to_arrow()
    delta = delta_rows(spec, storage.object_store.engine_options())
    for rows in (iceberg, delta):
        assert sorted(rows.column("value").to_pylist()) == sorted(before)


async def test_files_keep_their_codec_and_merges_write_the_current_one(
    table_parts: Parts,
) -> None:
    storage, topics, compactor = table_parts
    topic = await topics.create("changing", 1, {REWRITE_MIN_FILES_CONFIG: "2"})
    await fill(storage, topic, 0, 20)
    await compactor.until_idle()
    await topics.set_configs(
        "changing", {REWRITE_MIN_FILES_CONFIG: "2", TABLE_COMPRESSION_CONFIG: "snappy"}
    )
    for start in (20, 40):
        await fill(storage, topic, start, 20)
        await compactor.until_idle()
    assert await file_codecs(compactor, "changing") == [{"ZSTD"}, {"SNAPPY"}, {"SNAPPY"}]
    before = await read_values(storage, topic)

    await topics.set_configs(
        "changing", {REWRITE_MIN_FILES_CONFIG: "2", TABLE_COMPRESSION_CONFIG: "none"}
    )
    while await compactor.rewrite_once() is not None:
        pass

    assert await file_codecs(compactor, "changing") == [{"UNCOMPRESSED"}]
    assert await read_values(storage, topic) == before
    for name, rows in (await table_rows(compactor, "changing")).items():
        assert [value for _, _, value in rows] == before, name


async def test_log_compaction_writes_the_topics_codec(parts: Parts) -> None:
    storage, _, compactor = parts
    configs = {"cleanup.policy": "compact", TABLE_COMPRESSION_CONFIG: "gzip"}
    stream, before = await produce_updates(parts, configs)

    assert await compactor.clean_once() is not None

    latest = sorted({r.key: r for r in before}.values(), key=lambda r: r.offset)
    assert await storage.read_records(stream, 0) == latest
    (entry,) = await storage.index.scan(stream)
    assert isinstance(entry.location, ParquetLocation)
    codecs = codecs_of(await storage.object_store.get(entry.location.key))
    assert all(codecs[c] == {"GZIP"} for c in RECORD_COLUMNS)


async def test_dead_letter_files_take_the_topics_codec(table_parts: Parts) -> None:
    storage, topics, compactor = table_parts
    configs = {VALUE_SCHEMA_CONFIG: "registry", TABLE_COMPRESSION_CONFIG: "snappy"}
    topic = await topics.create("orders", 1, configs)
    v1 = await register(storage, V1)
    good = encoded(v1, V1, order(1))
    await storage.append(topic.streams[0], [Record(0, 1000, None, v) for v in (good, b"{}")])

    await compactor.until_idle()

    assert await file_codecs(compactor, "orders") == [{"SNAPPY"}]
    root = layout.dead_letter_root("orders") + "/"
    letters = [i.key async for i in storage.object_store.list(root) if i.key.endswith(".parquet")]
    assert len(letters) == 1
    codecs = codecs_of(await storage.object_store.get(letters[0]))
    assert codecs["value"] == {"SNAPPY"}


async def test_the_broker_wide_codec_applies_where_the_topic_sets_none(
    gzip_parts: Parts,
) -> None:
    storage, topics, compactor = gzip_parts
    default = await topics.create("broker-wide", 1)
    own = await topics.create("own-codec", 1, {TABLE_COMPRESSION_CONFIG: "zstd"})
    for t in (default, own):
        await fill(storage, t, 0, 50)

    await compactor.until_idle()

    assert await file_codecs(compactor, "broker-wide") == [{"GZIP"}]
    assert await file_codecs(compactor, "own-codec") == [{"ZSTD"}]
    assert len(await read_values(storage, default)) == 50


def test_a_task_record_keeps_its_codecs_and_older_records_mean_zstd() -> None:
    task = CompactionTask("t", (), ((7, "a.parquet"),), codecs=((7, "snappy"),))
    assert _decode_task(_encode_task(task)) == task
    older = _encode_task(CompactionTask("t", (), ((7, "a.parquet"),)))[:-1]
    assert _decode_task(older).codecs == ()
