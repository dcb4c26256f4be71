"""Rebuilding Kafka batches from table rows, the CPU-heavy step of a catch-up read.

MB/s is ``extra_info["bytes"]`` divided by the mean time. Run with
``.venv/bin/pytest tests/bench/test_bench_rebuild.py --benchmark-enable``.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.parquet import RowBuilder
from icefloe.storage.rebuild import rebuild_batches
from icefloe.storage.records import Record, build_batch

BATCHES = 64
RECORDS_PER_BATCH = 64


def table_of(value_bytes: int, headers: tuple[tuple[str, bytes], ...]) -> pa.Table:
    """About one row group: 64 producer batches of 64 records each."""
    rows = RowBuilder(partition=0)
    for n in range(BATCHES):
        base = n * RECORDS_PER_BATCH
        records = [
            Record(base + i, 1_700_000_000_000 + i, None, os.urandom(value_bytes), headers)
            for i in range(RECORDS_PER_BATCH)
        ]
        rows.add_batch(build_batch(records, base_offset=base), base)
    return rows.table()


@pytest.mark.parametrize(
    ("value_bytes", "headers"),
    [(1024, ()), (100, ()), (100, (("trace", b"abc"), ("type", b"order")))],
    ids=["1KiB", "100B", "100B-2-headers"],
)
def test_rebuild_batches(
    benchmark: BenchmarkFixture, value_bytes: int, headers: tuple[tuple[str, bytes], ...]
) -> None:
    table = table_of(value_bytes, headers)
    expected = len(rebuild_batches(table))
    benchmark.extra_info["bytes"] = expected

    assert len(benchmark(rebuild_batches, table)) == expected
