"""Turning record batches into table rows, the per-record step of compaction.

Run with ``.venv/bin/pytest tests/bench/test_bench_rows.py --benchmark-enable``; each round
decodes 256 batches of 64 records into one Arrow table.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.parquet import RowBuilder
from icefloe.storage.records import Header, Record, build_batch

BATCHES = 256
RECORDS_PER_BATCH = 64


def batches_of(value_bytes: int, headers: tuple[Header, ...]) -> list[tuple[bytes, int]]:
    batches = []
    for n in range(BATCHES):
        base = n * RECORDS_PER_BATCH
        records = [
            Record(base + i, 1_700_000_000_000 + i, None, os.urandom(value_bytes), headers)
            for i in range(RECORDS_PER_BATCH)
        ]
        batches.append((build_batch(records, base_offset=base), base))
    return batches


def rows_of(batches: list[tuple[bytes, int]]) -> pa.Table:
    rows = RowBuilder(partition=0)
    for batch, base in batches:
        rows.add_batch(batch, base)
    return rows.table()


@pytest.mark.parametrize(
    ("value_bytes", "headers"),
    [(1024, ()), (100, ()), (100, (("trace", b"abc"), ("type", b"order")))],
    ids=["1KiB", "100B", "100B-2-headers"],
)
def test_rows_from_batches(
    benchmark: BenchmarkFixture, value_bytes: int, headers: tuple[Header, ...]
) -> None:
    batches = batches_of(value_bytes, headers)
    benchmark.extra_info["records"] = BATCHES * RECORDS_PER_BATCH

    assert benchmark(rows_of, batches).num_rows == BATCHES * RECORDS_PER_BATCH
