"""Turning record batches into table rows, the per-record step of compaction.

Run with ``.venv/bin/pytest tests/bench/test_bench_rows.py --benchmark-enable``; each round
decodes 256 batches of 64 records into one Arrow table.
"""

from __future__ import annotations

from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.records import Header
from tests.bench.producer_batches import RECORDS_PER_BATCH, SHAPES, producer_batches, rows_of

BATCHES = 256


@SHAPES
def test_rows_from_batches(
    benchmark: BenchmarkFixture, value_bytes: int, headers: tuple[Header, ...]
) -> None:
    batches = producer_batches(BATCHES, value_bytes, headers)
    benchmark.extra_info["records"] = BATCHES * RECORDS_PER_BATCH

    assert benchmark(rows_of, batches).num_rows == BATCHES * RECORDS_PER_BATCH
