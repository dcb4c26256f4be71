"""The two CPU-heavy steps of a catch-up read from Parquet: decoding a row group of a data
file, and rebuilding Kafka batches from its rows.

MB/s is ``extra_info["bytes"]`` (the rebuilt batches) divided by the mean time. Run with
``.venv/bin/pytest tests/bench/test_bench_rebuild.py --benchmark-enable``.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator

import pyarrow.parquet as pq
import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.parquet import encode_parquet
from icefloe.storage.parquet_reader import KAFKA_COLUMNS
from icefloe.storage.rebuild import rebuild_batches, rebuild_group, rebuild_groups
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


@SHAPES
def test_decode_row_groups(
    benchmark: BenchmarkFixture, value_bytes: int, headers: tuple[Header, ...]
) -> None:
    table = rows_of(producer_batches(BATCHES, value_bytes, headers))
    data, groups = encode_parquet(table)
    metadata = pq.ParquetFile(io.BytesIO(data)).metadata
    benchmark.extra_info["bytes"] = len(rebuild_batches(table))

    def decode_each() -> int:
        """Rows decoded, a row group at a time, as catch-up reads decode them."""
        rows = 0
        for group in range(len(groups)):
            parquet = pq.ParquetFile(io.BytesIO(data), metadata=metadata)
            read = parquet.read_row_groups([group], columns=KAFKA_COLUMNS, use_threads=False)
            rows += read.num_rows
        return rows

    assert benchmark(decode_each) == table.num_rows


@pytest.fixture
def busy_thread() -> Iterator[None]:
    """A thread that wants the GIL back every few microseconds, as a broker's event loop does
    while it serves sockets."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            sum(range(200))
            os.stat(".")  # a system call: the GIL is let go and taken back

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


@pytest.mark.parametrize("batches", [16, 64], ids=["1MiB", "4MiB"])
def test_rebuild_1kib_records_beside_a_busy_thread(
    benchmark: BenchmarkFixture, busy_thread: None, batches: int
) -> None:
    """The rebuild's numpy and Arrow steps each let the GIL go and wait to take it back: beside
    a busy thread that costs per step, so rebuilding more rows at once costs less a row. A row
    group of 1 KiB records holds 1 MiB; compare ``extra_info["bytes"]`` / mean between the two."""
    table = rows_of(producer_batches(batches, 1024, ()))
    expected = len(rebuild_batches(table))
    benchmark.extra_info["bytes"] = expected

    assert len(benchmark(rebuild_batches, table)) == expected


GROUPS_TOGETHER = 4


@pytest.mark.parametrize("together", [True, False], ids=["together", "one-by-one"])
def test_rebuild_four_1mib_groups(benchmark: BenchmarkFixture, together: bool) -> None:
    """Four row groups of 1 MiB (16 batches of 64 records of 1 KiB each), rebuilt in one call
    or a call each, as reads ahead and fetches' own loads rebuild them: a call's fixed cost
    against its rows'. Compare the two means."""
    table = rows_of(producer_batches(16 * GROUPS_TOGETHER, 1024, ()))
    rows = table.num_rows // GROUPS_TOGETHER
    slices = [table.slice(rows * n, rows) for n in range(GROUPS_TOGETHER)]
    benchmark.extra_info["bytes"] = len(rebuild_batches(table))

    def rebuild() -> int:
        if together:
            return len(rebuild_groups(table, [rows] * GROUPS_TOGETHER))
        return len([rebuild_group(part) for part in slices])

    assert benchmark(rebuild) == GROUPS_TOGETHER
