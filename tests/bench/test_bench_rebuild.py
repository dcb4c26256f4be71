"""Rebuilding Kafka batches from table rows, the CPU-heavy step of a catch-up read.

MB/s is ``extra_info["bytes"]`` divided by the mean time. Run with
``.venv/bin/pytest tests/bench/test_bench_rebuild.py --benchmark-enable``.
"""

from __future__ import annotations

from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.rebuild import rebuild_batches
from icefloe.storage.records import Header
from tests.bench.producer_batches import SHAPES, producer_batches, rows_of

BATCHES = 64
"""About one row group: 64 producer batches of 64 records each."""


@SHAPES
def test_rebuild_batches(
    benchmark: BenchmarkFixture, value_bytes: int, headers: tuple[Header, ...]
) -> None:
    table = rows_of(producer_batches(BATCHES, value_bytes, headers))
    expected = len(rebuild_batches(table))
    benchmark.extra_info["bytes"] = expected

    assert len(benchmark(rebuild_batches, table)) == expected
