"""Table rows decoded column-wise hold what the record-by-record decoder reads, and bytes it
refuses are refused."""

from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icefloe.storage import parquet
from icefloe.storage.batch import (
    ATTRIBUTES_AT,
    CRC_AT,
    HEADER_SIZE,
    BatchError,
    Compression,
    TimestampType,
    read_header,
)
from icefloe.storage.parquet import RowBuilder
from icefloe.storage.records import Header, Record, build_batch, decode_batch

T0 = 1_700_000_000_000

header = st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=20))
record = st.tuples(
    st.integers(-(2**45), 2**45),  # timestamp delta: one to seven varint bytes
    st.integers(1, 2**20),  # offset step
    st.none() | st.binary(max_size=30),  # keys either side of the 12 bytes held inline
    st.none() | st.binary(max_size=200),
    st.lists(header, max_size=3).map(tuple),
)
batch = st.tuples(
    st.lists(record, min_size=1, max_size=10),
    st.sampled_from(list(Compression)),
    st.sampled_from(list(TimestampType)),
)


RecordSpec = tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]


def built(
    fields: list[RecordSpec],
    base: int,
    compression: Compression = Compression.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
) -> bytes:
    """One batch of records from (timestamp delta, offset step, key, value, headers)."""
    records = []
    offset = base
    for i, (delta, step, key, value, headers) in enumerate(fields):
        offset += step if i else 0
        records.append(Record(offset, T0 + delta, key, value, headers))
    return build_batch(
        records, base_offset=base, compression=compression, timestamp_type=timestamp_type
    )


def reference_records(batches: list[tuple[bytes, int]]) -> list[Record]:
    out = []
    for data, base in batches:
        out += decode_batch(data, base_offset=base)[1]
    return out


def table_of(batches: list[tuple[bytes, int]]) -> pa.Table:
    rows = RowBuilder(partition=0)
    for data, base in batches:
        rows.add_batch(data, base)
    return rows.table()


def as_millis(table: pa.Table) -> list[int]:
    return table.column("timestamp").cast(pa.int64()).to_pylist()


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(batch, min_size=1, max_size=5))
def test_rows_hold_every_field_the_record_decoder_reads(
    specs: list[tuple[list[RecordSpec], Compression, TimestampType]],
) -> None:
    batches = []
    base = 0
    for fields, compression, timestamp_type in specs:
        batches.append((built(fields, base, compression, timestamp_type), base))
        base += 10 * 2**20
    table = table_of(batches)
    expected = reference_records(batches)

    assert table.column("offset").to_pylist() == [r.offset for r in expected]
    assert [t // 1000 for t in as_millis(table)] == [r.timestamp for r in expected]
    assert table.column("key").to_pylist() == [r.key for r in expected]
    assert table.column("value").to_pylist() == [r.value for r in expected]
    assert [
        tuple((h["key"], h["value"]) for h in row) for row in table.column("headers").to_pylist()
    ] == [r.headers for r in expected]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(record, min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_damaged_records_are_refused_exactly_when_the_record_decoder_refuses_them(
    fields: list[RecordSpec], damage: list[tuple[int, int]]
) -> None:
    """Bytes changed inside the records (with a CRC that matches them, as a hostile producer
    would send) either decode to what the record decoder reads or raise a BatchError; offset
    deltas that no batch can hold are numbered by position."""
    data = bytearray(built(fields, 0))
    span = len(data) - HEADER_SIZE
    for at, byte in damage:
        data[HEADER_SIZE + at % span] = byte
    struct.pack_into(">I", data, CRC_AT, crc32c(memoryview(data)[ATTRIBUTES_AT:]))
    try:
        expected = decode_batch(bytes(data))[1]
    except BatchError:
        with pytest.raises(BatchError):
            table_of([(bytes(data), 0)])
        return
    if any(not -(2**63) // 1000 <= r.timestamp < 2**63 // 1000 for r in expected):
        return  # not a timestamp the table can hold either way
    table = table_of([(bytes(data), 0)])
    deltas = [r.offset for r in expected]
    last = read_header(data).last_offset_delta
    if not (all(0 <= d <= last for d in deltas) and deltas == sorted(set(deltas))):
        deltas = list(range(len(expected)))  # deltas no batch holds: numbered by position
    assert table.column("offset").to_pylist() == deltas
    assert table.column("key").to_pylist() == [r.key for r in expected]
    assert table.column("value").to_pylist() == [r.value for r in expected]


def test_batches_beyond_one_segment_make_a_table_in_chunks_with_the_same_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches = [(built([(i, 1, b"k%d" % i, bytes(100), ())] * 3, 3 * i), 3 * i) for i in range(10)]
    whole = table_of(batches)
    monkeypatch.setattr(parquet, "SEGMENT_BYTES", 400)
    chunked = table_of(batches)

    assert chunked.column("offset").num_chunks > 1
    assert chunked.equals(whole)


def test_a_builder_with_no_records_makes_an_empty_table() -> None:
    assert RowBuilder(partition=0).table().num_rows == 0
