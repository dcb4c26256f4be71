"""Produce and fetch hot path: validate 16 KiB batches of 1 KiB records, then patch offsets.

Throughput is ``extra_info["bytes"]`` divided by the mean time. Run with
``.venv/bin/pytest tests/bench --benchmark-enable``.
"""

from __future__ import annotations

import os

from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.batch import patch_base_offsets, split_and_validate
from icefloe.storage.records import Record, build_batch

RECORDS_PER_BATCH = 15  # 15 x (1 KiB + framing) is just under 16 KiB
BATCHES = 256  # about 4 MiB, one cost-mode WAL object's worth


def produce_data() -> bytes:
    return b"".join(
        build_batch([Record(i, 1_700_000_000_000 + i, None, os.urandom(1024)) for i in range(15)])
        for _ in range(BATCHES)
    )


def test_validate_then_patch_16k_batches(benchmark: BenchmarkFixture) -> None:
    data = produce_data()
    benchmark.extra_info["bytes"] = len(data)

    def validate_then_patch() -> bytearray:
        split_and_validate(data, max_batch_bytes=1 << 20)
        return patch_base_offsets(data, 1_000_000)

    patched = benchmark(validate_then_patch)

    assert len(patched) == len(data)


def test_validate_16k_batches(benchmark: BenchmarkFixture) -> None:
    data = produce_data()
    benchmark.extra_info["bytes"] = len(data)

    infos = benchmark(split_and_validate, data, max_batch_bytes=1 << 20)

    assert len(infos) == BATCHES
