"""Producer batches of chosen shapes, shared by the benchmarks of the table-row steps."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from icefloe.storage.parquet import RowBuilder
from icefloe.storage.records import Header, Record, build_batch

RECORDS_PER_BATCH = 64

SHAPES = pytest.mark.parametrize(
    ("value_bytes", "headers"),
    [(1024, ()), (100, ()), (100, (("trace", b"abc"), ("type", b"order")))],
    ids=["1KiB", "100B", "100B-2-headers"],
)
"""Record shapes the benchmarks run with: large values, small values, small values with
headers."""


def producer_batches(
    count: int, value_bytes: int, headers: tuple[Header, ...]
) -> list[tuple[bytes, int]]:
    """``count`` batches of 64 records of random values, each with its base offset."""
    batches = []
    for n in range(count):
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
