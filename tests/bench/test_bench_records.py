"""Record decoding, the CPU-heavy step of compaction: records per second.

Records per second is ``extra_info["records"]`` divided by the mean time. Run with
``.venv/bin/pytest tests/bench --benchmark-enable``.
"""

from __future__ import annotations

import os

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.batch import Compression
from icefloe.storage.records import Record, build_batch, decode_batch

BATCHES = 64
RECORDS_PER_BATCH = 15


@pytest.mark.parametrize(
    "compression", [Compression.NONE, Compression.ZSTD], ids=lambda c: c.name.lower()
)
def test_decode_1k_records(benchmark: BenchmarkFixture, compression: Compression) -> None:
    # Half random, half repeated bytes: compressible, like most real payloads.
    batches = [
        build_batch(
            [
                Record(i, 1_700_000_000_000 + i, b"key-%d" % i, os.urandom(512) + b"x" * 512)
                for i in range(RECORDS_PER_BATCH)
            ],
            compression=compression,
        )
        for _ in range(BATCHES)
    ]
    benchmark.extra_info["records"] = BATCHES * RECORDS_PER_BATCH

    def decode_all() -> int:
        return sum(len(decode_batch(batch)[1]) for batch in batches)

    assert benchmark(decode_all) == BATCHES * RECORDS_PER_BATCH


def test_decode_small_records_with_headers(benchmark: BenchmarkFixture) -> None:
    batch = build_batch(
        [
            Record(i, 1_700_000_000_000 + i, b"k%d" % i, b"v" * 40, (("trace", b"abc"),))
            for i in range(1000)
        ]
    )
    benchmark.extra_info["records"] = 1000

    _, records = benchmark(decode_batch, batch)

    assert len(records) == 1000
