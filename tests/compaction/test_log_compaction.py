"""Log compaction (cleanup.policy=compact): the key logic on rows, the trigger, batches rebuilt
with Kafka's gaps, and the pipeline from WAL to cleaned Parquet files in the index and in both
tables."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pyarrow as pa
import pytest

from icefloe.compaction.cleaner import CleanSettings, cleanable
from icefloe.compaction.committer import Cleaned
from icefloe.compaction.log_cleaning import (
    KeyMap,
    check_offsets,
    surviving,
    tombstone_expiry_ms,
)
from icefloe.errors import CorruptDataError, KafkaError
from icefloe.ports.compaction import CleanSpec, Source, StreamRange
from icefloe.storage.batch import read_header
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
from icefloe.storage.keyed import KeylessRecordsError
from icefloe.storage.parquet import RowBuilder
from icefloe.storage.rebuild import rebuild_batches
from icefloe.storage.records import Record, build_batch, decode_batch
from icefloe.testing.table_contract import rows_of
from tests.compaction.conftest import Parts
from tests.support.table_readers import delta_rows, duckdb_connection, iceberg_rows

NOW = 1_750_000_000_000
DAY = 24 * 3600 * 1000


def rows(*records: tuple[int, bytes | None, bytes | None], timestamp: int = NOW) -> pa.Table:
    """Table rows of single-record batches ``(offset, key, value)``."""
    builder = RowBuilder(0)
    for offset, key, value in records:
        batch = build_batch([Record(0, timestamp, key, value)])
        builder.add_batch(batch, offset)
    return builder.table()


def spec(dirty_start: int = 0, horizon: int = NOW - DAY, retention: int = DAY) -> CleanSpec:
    return CleanSpec(dirty_start, horizon, retention)


def keyed_map(table: pa.Table, dirty_start: int = 0) -> KeyMap:
    key_map = KeyMap()
    dirty = table.filter(pa.compute.greater_equal(table.column("offset"), dirty_start))
    key_map.add(dirty.column("key"), dirty.column("offset"))
    return key_map


def kept(table: pa.Table, clean: CleanSpec) -> list[tuple[int, bytes | None, bytes | None]]:
    out = surviving(table, keyed_map(table, clean.dirty_start), clean)
    return list(zip(*(out.column(c).to_pylist() for c in ("offset", "key", "value")), strict=True))


# --- the key logic -------------------------------------------------------------------------


def test_the_latest_record_of_each_key_survives_with_its_offset() -> None:
    table = rows(
        (0, b"a", b"1"), (1, b"b", b"1"), (2, b"a", b"2"), (5, b"c", b"1"), (7, b"a", b"3")
    )
    assert kept(table, spec()) == [(1, b"b", b"1"), (5, b"c", b"1"), (7, b"a", b"3")]


def test_transactional_records_are_left_alone() -> None:
    builder = RowBuilder(0)
    builder.add_batch(build_batch([Record(0, NOW, b"a", b"1")]), 0)
    builder.add_batch(
        build_batch(
            [Record(0, NOW, b"a", b"txn")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=0,
            is_transactional=True,
        ),
        1,
    )
    builder.add_batch(
        build_batch(
            [Record(0, NOW, b"b", b"1")],
            producer_id=7,
            producer_epoch=0,
            base_sequence=1,
            is_transactional=True,
        ),
        2,
    )
    builder.add_batch(build_batch([Record(0, NOW, b"b", b"2")]), 3)
    table = builder.table()
    key_map = KeyMap()
    plain = table.filter(pa.compute.equal(table.column("batch_attributes"), 0))
    key_map.add(plain.column("key"), plain.column("offset"))
    out = surviving(table, key_map, spec())
    # Offset 0 stays (only a transactional record replaces it); 1 and 2 stay as written.
    assert out.column("offset").to_pylist() == [0, 1, 2, 3]


def test_records_without_a_key_go_and_control_records_stay() -> None:
    table = rows((0, None, b"x"), (1, b"a", b"1"))
    control = RowBuilder(0)
    # A transaction marker with a null value, stamped long ago: a plain tombstone would go.
    control.add_batch(build_batch([Record(0, NOW - 2 * DAY, b"\0\0\0\0", None)]), 2)
    table = pa.concat_tables([table, control.table()])
    attributes = table.column("batch_attributes").to_pylist()
    table = table.set_column(
        table.schema.get_field_index("batch_attributes"),
        "batch_attributes",
        pa.array([a | (0x20 if i == 2 else 0) for i, a in enumerate(attributes)], pa.int32()),
    )
    assert [o for o, _, _ in kept(table, spec())] == [1, 2]


def test_tombstones_stay_until_delete_retention_then_go() -> None:
    old = rows((0, b"a", b"1"), (1, b"a", None), timestamp=NOW - 2 * DAY)
    recent = rows((2, b"b", b"1"), (3, b"b", None), timestamp=NOW - 1000)
    table = pa.concat_tables([old, recent])
    horizon = NOW - DAY  # delete.retention.ms = one day
    assert kept(table, spec(horizon=horizon)) == [(3, b"b", None)]
    # A day later the newer tombstone is past its retention too.
    assert kept(table, spec(horizon=horizon + DAY)) == []
    # The tombstone kept says when it may go: its timestamp plus delete.retention.ms.
    out = surviving(table, keyed_map(table), spec(horizon=horizon))
    assert tombstone_expiry_ms(out, spec(horizon=horizon)) == NOW - 1000 + DAY


def test_clean_records_stay_unless_a_dirty_record_replaces_their_key() -> None:
    # Offsets 0-2 were cleaned before (keys unique there); 3-4 are dirty.
    table = rows(
        (0, b"a", b"1"), (1, b"b", b"1"), (2, b"c", b"1"), (3, b"b", b"2"), (4, b"d", b"1")
    )
    assert kept(table, spec(dirty_start=3)) == [
        (0, b"a", b"1"),
        (2, b"c", b"1"),
        (3, b"b", b"2"),
        (4, b"d", b"1"),
    ]


def test_the_key_map_keeps_the_latest_offset_across_many_additions() -> None:
    key_map = KeyMap()
    for round_ in range(5):
        keys = pa.array([b"k%d" % (i % 7) for i in range(20)])
        offsets = pa.array([round_ * 100 + i for i in range(20)], pa.int64())
        key_map.add(keys, offsets)
    assert len(key_map) == 7
    latest = key_map.latest(pa.array([b"k0", b"k6", b"zz", None], pa.binary()))
    assert latest.tolist() == [414, 413, -1, -1]


def test_stored_files_are_checked_and_an_empty_one_is_accepted() -> None:
    table = rows((3, b"a", b"1"), (5, b"b", b"1"))
    check_offsets(table, StreamRange(1, 0, 0, 10, "f", 0, 0, Source.PARQUET))
    check_offsets(table.slice(0, 0), StreamRange(1, 0, 0, 10, "f", 0, 0, Source.PARQUET))
    for start, end in ((4, 10), (0, 5)):
        with pytest.raises(CorruptDataError):
            check_offsets(table, StreamRange(1, 0, start, end, "f", 0, 0, Source.PARQUET))
    with pytest.raises(CorruptDataError):
        check_offsets(table.take([1, 0]), StreamRange(1, 0, 0, 10, "f", 0, 0, Source.PARQUET))


# --- batches rebuilt with gaps -------------------------------------------------------------


def test_rebuilt_batches_keep_offsets_and_gaps_and_reach_the_end_of_the_file() -> None:
    builder = RowBuilder(0)
    records = [Record(i, NOW + i, b"k%d" % i, b"v%d" % i) for i in range(5)]
    builder.add_batch(build_batch(records), 10)  # offsets 10-14
    builder.add_batch(build_batch(records), 15)  # offsets 15-19
    table = builder.table()
    thinned = table.take(pa.array([1, 3, 6]))  # offsets 11, 13, 16 survive
    data = rebuild_batches(thinned, end_offset=20)
    first = read_header(data)
    second = read_header(data, first.size)
    assert (first.base_offset, first.record_count, first.last_offset_delta) == (10, 2, 4)
    assert (second.base_offset, second.record_count, second.last_offset_delta) == (15, 1, 4)
    _, decoded = decode_batch(data[: first.size])
    assert [(r.offset, r.key, r.timestamp) for r in decoded] == [
        (11, b"k1", NOW + 1),
        (13, b"k3", NOW + 3),
    ]
    # Without gaps nothing changes: the last offset delta is the batch's own.
    assert read_header(rebuild_batches(table, end_offset=20)).last_offset_delta == 4


# --- the trigger ---------------------------------------------------------------------------


def entry(start: int, end: int, size: int, timestamp: int, *, wal: bool = False) -> IndexEntry:
    location = WalLocation("w", 0, size) if wal else ParquetLocation(f"f{end}", size, ())
    return IndexEntry(1, end, 0, end - start, location, timestamp, timestamp, timestamp, ())


SETTINGS = CleanSettings(True, DAY, 0, 2**63 - 1, 0.5)


def test_a_stream_is_due_once_half_its_bytes_are_dirty() -> None:
    entries = [entry(0, 10, 100, NOW), entry(10, 20, 60, NOW), entry(20, 30, 50, NOW)]
    cleaned = Cleaned(10, None)
    found = cleanable(entries, cleaned, SETTINGS, NOW, 10**9)
    assert (found.dirty_start, found.dirty_bytes, found.clean_bytes) == (10, 110, 100)
    assert found.due
    assert not cleanable(entries[:2], cleaned, SETTINGS, NOW, 10**9).due  # 60 of 160
    assert not cleanable(entries, Cleaned(30, None), SETTINGS, NOW, 10**9).due  # all clean


def test_wal_entries_and_records_younger_than_min_compaction_lag_are_not_cleaned() -> None:
    entries = [entry(0, 10, 100, NOW - 60_000), entry(10, 20, 100, NOW), entry(20, 30, 9, NOW)]
    lagging = CleanSettings(True, DAY, 30_000, 2**63 - 1, 0.5)
    found = cleanable(entries, None, lagging, NOW, 10**9)
    assert [e.end for e in found.entries] == [10]
    wal = [entry(0, 10, 100, NOW), entry(10, 20, 100, NOW, wal=True), entry(20, 30, 9, NOW)]
    assert [e.end for e in cleanable(wal, None, SETTINGS, NOW, 10**9).entries] == [10]


def test_max_compaction_lag_and_expiring_tombstones_make_a_stream_due() -> None:
    entries = [entry(0, 10, 1000, NOW - 5000), entry(10, 20, 10, NOW - 5000)]
    assert not cleanable(entries, Cleaned(10, None), SETTINGS, NOW, 10**9).due
    lag = CleanSettings(True, DAY, 0, 4000, 0.5)
    assert cleanable(entries, Cleaned(10, None), lag, NOW, 10**9).due
    clean = Cleaned(20, NOW - 1)
    assert cleanable(entries, clean, SETTINGS, NOW, 10**9).due
    assert not cleanable(entries, Cleaned(20, NOW + 1), SETTINGS, NOW, 10**9).due


# --- keyless records are refused on a compacted topic --------------------------------------


async def test_a_compacted_topic_refuses_records_without_a_key(parts: Parts) -> None:
    storage, topics, _ = parts
    topic = await topics.create("t", 1, {"cleanup.policy": "compact"})
    batch = build_batch([Record(0, NOW, b"k", b"1"), Record(1, NOW, None, b"2")])
    with pytest.raises(KeylessRecordsError) as refused:
        await storage.submit_batches(topic.streams[0], batch, keys_required_for="t-0")
    assert isinstance(refused.value, KafkaError)
    assert refused.value.error_code == 87  # INVALID_RECORD
    assert refused.value.record_errors == (
        (1, "Compacted topic cannot accept message without key in topic partition t-0"),
    )
    assert await storage.log_end(topic.streams[0]) == 0


# --- the pipeline --------------------------------------------------------------------------


async def produce_updates(parts: Parts, configs: dict[str, str]) -> tuple[int, list[Record]]:
    """Three rounds of updates of keys k0-k4 (k4 deleted in the second), each round two
    batches and compacted into a data file of its own: offsets 0-4, 5-9 and 10-14."""
    storage, topics, compactor = parts
    topic = await topics.create("t", 1, configs)
    stream = topic.streams[0]
    now = int(time.time() * 1000)
    for round_ in range(3):
        records = [
            Record(
                0, now - 3 * DAY + i, b"k%d" % i, None if (round_, i) == (1, 4) else b"r%d" % round_
            )
            for i in range(5)
        ]
        await storage.append(stream, records[:3])
        await storage.append(stream, records[3:])
        await compactor.until_idle()
    return stream, await storage.read_records(stream, 0)


async def test_cleaning_keeps_the_latest_per_key_with_offsets_unchanged(parts: Parts) -> None:
    storage, _, compactor = parts
    stream, before = await produce_updates(parts, {"cleanup.policy": "compact"})
    assert len(before) == 15
    assert len(await storage.index.scan(stream)) == 3
    assert await compactor.clean_once() is not None  # all dirty: the ratio is 1
    after = await storage.read_records(stream, 0)
    latest = {r.key: r for r in before}
    assert after == sorted(latest.values(), key=lambda r: r.offset)
    assert [r.offset for r in after] == [10, 11, 12, 13, 14]
    assert await storage.log_end(stream) == 15
    assert await storage.log_start(stream) == 0
    # The two files that kept nothing joined the third one's range: the index holds the same
    # offsets. Reading from a removed offset gives the next record kept, in its batch.
    entries = await storage.index.scan(stream)
    assert [(e.start, e.end) for e in entries] == [(0, 15)]
    assert [r.offset for r in await storage.read_records(stream, 3)] == [10, 11, 12, 13, 14]
    data = (await storage.read(stream, 3)).data
    first = read_header(data)
    second = read_header(data, first.size)
    assert (first.base_offset, first.record_count, first.last_offset_delta) == (10, 3, 2)
    assert (second.base_offset, second.record_count, second.last_offset_delta) == (13, 2, 1)
    assert await compactor.clean_once() is None  # nothing dirty any more


async def test_tombstones_stay_for_delete_retention_then_go_and_reads_skip_the_gap(
    parts: Parts,
) -> None:
    storage, _, compactor = parts
    stream, _ = await produce_updates(parts, {"cleanup.policy": "compact"})
    # Tombstones of k3 and k4 (offsets 15 and 16), a day old but for two seconds.
    expiry = int(time.time() * 1000) + 2000
    await storage.append(stream, [Record(0, expiry - DAY, b"k%d" % i, None) for i in (3, 4)])
    await compactor.until_idle()
    await compactor.clean_once()
    after = [(r.offset, r.value) for r in await storage.read_records(stream, 0)]
    assert after == [(10, b"r2"), (11, b"r2"), (12, b"r2"), (15, None), (16, None)]
    header = read_header((await storage.read(stream, 0)).data)
    assert (header.base_offset, header.record_count, header.last_offset_delta) == (10, 3, 4)
    assert await compactor.clean_once() is None  # clean, and the tombstones are not due yet
    await asyncio.sleep(max(0.0, expiry / 1000 - time.time()) + 0.05)
    assert await compactor.clean_once() is not None
    assert [r.offset for r in await storage.read_records(stream, 0)] == [10, 11, 12]
    assert [(e.start, e.end) for e in await storage.index.scan(stream)] == [(0, 17)]
    # The last batch reaches the end of the file, so a consumer moves past the removed tail;
    # a read from inside it gets an empty batch that ends there, which moves a consumer too.
    read = await storage.read(stream, 0)
    header = read_header(read.data)
    assert (header.base_offset, header.record_count, header.last_offset_delta) == (10, 3, 6)
    assert read.next_offset == 17
    tail = await storage.read(stream, 15)
    header = read_header(tail.data)
    assert (header.base_offset, header.record_count, header.last_offset_delta) == (15, 0, 1)
    assert (header.size, tail.next_offset) == (len(tail.data), 17)
    assert await storage.log_end(stream) == 17


async def test_compact_and_delete_apply_retention_and_compaction(parts: Parts) -> None:
    storage, topics, compactor = parts
    stream, _ = await produce_updates(parts, {"cleanup.policy": "compact,delete"})
    now = int(time.time() * 1000)
    await storage.append(stream, [Record(0, now - DAY, b"k%d" % i, b"r3") for i in (0, 1)])
    await compactor.until_idle()
    last_two = sum(e.size for e in (await storage.index.scan(stream))[-2:])
    await topics.set_configs(
        "t", {"cleanup.policy": "compact,delete", "retention.bytes": str(last_two)}
    )
    assert await compactor.enforce_retention() == 2  # retention.bytes: the first two files go
    await compactor.clean_once()
    kept = [(r.offset, r.key, r.value) for r in await storage.read_records(stream, 10)]
    assert kept == [
        (12, b"k2", b"r2"),
        (13, b"k3", b"r2"),
        (14, b"k4", b"r2"),
        (15, b"k0", b"r3"),
        (16, b"k1", b"r3"),
    ]
    assert await storage.log_start(stream) == 10


async def test_a_topic_that_is_not_compacted_is_never_cleaned(parts: Parts) -> None:
    storage, _, compactor = parts
    stream, before = await produce_updates(parts, {})
    assert await compactor.clean_once(force=True) is None
    assert await storage.read_records(stream, 0) == before


CURRENT_STATE = """
    SELECT "partition", key, value FROM {relation}
    QUALIFY row_number() OVER (PARTITION BY "partition", key ORDER BY "offset" DESC) = 1
        AND value IS NOT NULL
    ORDER BY "partition", key
"""


async def test_the_tables_hold_what_the_log_holds_and_the_current_state_query_reads_it(
    table_parts: Parts, tmp_path: Path
) -> None:
    storage, _, compactor = table_parts
    stream, _ = await produce_updates(table_parts, {"cleanup.policy": "compact"})
    # A later update of k0 and a deletion of k1 (a tombstone the cleaning keeps).
    now = int(time.time() * 1000)
    await storage.append(stream, [Record(0, now, b"k0", b"new"), Record(0, now, b"k1", None)])
    await compactor.until_idle()
    expected_state = [(0, b"k0", b"new"), (0, b"k2", b"r2"), (0, b"k3", b"r2"), (0, b"k4", b"r2")]
    duckdb = duckdb_connection()
    for cleaned in (False, True):
        if cleaned:
            await compactor.clean_once(force=True)
        log = [(0, r.offset, r.key, r.value) for r in await storage.read_records(stream, 0)]
        assert len(log) == (5 if cleaned else 17)
        spec = compactor.committer.table_spec("t")
        iceberg = await compactor.table_formats["iceberg"].ensure_table(spec)
        delta = await compactor.table_formats["delta"].ensure_table(spec)
        for relation in (
            f"iceberg_scan('{iceberg.metadata_location}')",
            f"delta_scan('{delta.location}')",
        ):
            table = duckdb.execute(f'SELECT "partition", "offset", key, value FROM {relation}')
            assert rows_of(pa.table(table.fetch_arrow_table())) == log
            state = duckdb.execute(CURRENT_STATE.format(relation=relation)).fetchall()
            assert state == expected_state
        assert delta_rows(delta.location, {}) == log
        catalog = tmp_path / "iceberg-catalog.db"
        assert iceberg_rows(iceberg.identifier, catalog, {}) == log
