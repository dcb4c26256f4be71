"""Delta ``stats`` read from a Parquet footer: every unit of timestamp, signed and unsigned
integers, several row groups, and columns the writer kept no statistics for."""

from __future__ import annotations

import datetime
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from icefloe_table_delta.stats import stats_json, timestamp_range_ms

UTC = datetime.UTC


def footer(table: pa.Table, **options: object) -> pq.FileMetaData:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=2, **options)  # type: ignore[arg-type]
    return pq.read_metadata(pa.BufferReader(sink.getvalue()))


def stats(table: pa.Table, **options: object) -> dict[str, object]:
    return dict(json.loads(stats_json(footer(table, **options))))


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
def test_timestamps_of_every_unit_give_milliseconds_with_the_maximum_rounded_up(
    unit: str,
) -> None:
    low = datetime.datetime(2026, 1, 2, 3, 4, 5, 6_000, tzinfo=UTC)
    high = datetime.datetime(2026, 1, 2, 3, 4, 5, 7_001 if unit != "ms" else 8_000, tzinfo=UTC)
    middle = low + (high - low) / 2
    table = pa.table({"t": pa.array([middle, high, low], pa.timestamp(unit, "UTC"))})

    got = stats(table)

    assert got["minValues"] == {"t": "2026-01-02T03:04:05.006Z"}
    assert got["maxValues"] == {"t": "2026-01-02T03:04:05.008Z"}
    assert got["nullCount"] == {"t": 0}


def test_a_nanosecond_past_a_millisecond_rounds_the_maximum_up() -> None:
    just_past = pa.array([1_000_001], pa.timestamp("ns", "UTC"))  # 1 ms and 1 ns

    got = stats(pa.table({"t": just_past}))

    assert got["minValues"] == {"t": "1970-01-01T00:00:00.001Z"}
    assert got["maxValues"] == {"t": "1970-01-01T00:00:00.002Z"}


def test_timestamps_without_a_zone_are_read_as_utc() -> None:
    naive = datetime.datetime(2026, 5, 6, 7, 8, 9, 10_000)
    got = stats(pa.table({"t": pa.array([naive], pa.timestamp("us"))}))

    assert got["minValues"] == got["maxValues"] == {"t": "2026-05-06T07:08:09.010Z"}


def test_integers_span_every_row_group_and_nulls_are_counted_across_them() -> None:
    table = pa.table(
        {
            "small": pa.array([5, -3, None, 7, 2], pa.int8()),
            "offset": pa.array([10, 11, 12, 13, 14], pa.int64()),
            "unsigned": pa.array([2**64 - 1, 0, 1, 2, 3], pa.uint64()),
        }
    )

    got = stats(table)

    assert got["numRecords"] == 5
    assert got["minValues"] == {"small": -3, "offset": 10, "unsigned": 0}
    assert got["maxValues"] == {"small": 7, "offset": 14, "unsigned": 2**64 - 1}
    assert got["nullCount"] == {"small": 1, "offset": 0, "unsigned": 0}


def test_columns_without_statistics_and_non_numeric_ones_get_no_bounds() -> None:
    table = pa.table(
        {
            "offset": pa.array([1, 2, 3], pa.int64()),
            "value": pa.array([b"a", None, b"c"]),
            "quiet": pa.array([4, 5, 6], pa.int64()),
        }
    )

    got = stats(table, write_statistics=["offset", "value"])

    assert got["minValues"] == {"offset": 1}
    assert got["maxValues"] == {"offset": 3}
    assert got["nullCount"] == {"offset": 0, "value": 1}


def test_timestamp_range_is_in_milliseconds_rounded_down() -> None:
    table = pa.table({"t": pa.array([1_500, 2_999, 2_000], pa.timestamp("us", "UTC"))})

    assert timestamp_range_ms(footer(table), "t") == (1, 2)


def test_timestamp_range_is_none_without_statistics_or_rows() -> None:
    table = pa.table({"t": pa.array([1_500], pa.timestamp("us", "UTC"))})

    assert timestamp_range_ms(footer(table, write_statistics=False), "t") is None
    assert timestamp_range_ms(footer(table.slice(0, 0)), "t") is None
    assert timestamp_range_ms(footer(table), "missing") is None


def test_timestamp_range_of_nanoseconds_is_cut_to_the_millisecond_of_each_row() -> None:
    last_of_a_millisecond = pa.array([1_999_999, 1_000_000], pa.timestamp("ns", "UTC"))

    assert timestamp_range_ms(footer(pa.table({"t": last_of_a_millisecond})), "t") == (1, 1)
