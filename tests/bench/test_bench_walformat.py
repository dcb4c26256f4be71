"""Sealing and reading a cost-mode WAL object: about 4 MiB over 8 streams.

Throughput is ``extra_info["bytes"]`` divided by the mean time. Run with
``.venv/bin/pytest tests/bench --benchmark-enable``.
"""

from __future__ import annotations

import os

from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.records import Record, build_batch
from icefloe.storage.walformat import ChunkInput, decode_wal_object, encode_wal_object

STREAMS = 8
BATCHES_PER_STREAM = 32  # 8 x 32 batches of ~16 KiB: about 4 MiB


def streams() -> list[ChunkInput]:
    """Distinct batches (a repeated one would sit in the CPU cache and flatter the figure)."""
    return [
        ChunkInput(stream, [memoryview(batch()) for _ in range(BATCHES_PER_STREAM)])
        for stream in range(100 + STREAMS, 100, -1)
    ]


def batch() -> bytes:
    return build_batch([Record(i, 1_700_000_000_000, None, os.urandom(1024)) for i in range(15)])


def test_encode_4mib_object(benchmark: BenchmarkFixture) -> None:
    payload = streams()
    benchmark.extra_info["bytes"] = sum(len(v) for chunk in payload for v in chunk.batches)

    encoded = benchmark(encode_wal_object, payload, created_ms=1_700_000_000_000)

    assert len(encoded.chunks) == STREAMS


def test_decode_4mib_object(benchmark: BenchmarkFixture) -> None:
    data = encode_wal_object(streams(), created_ms=1_700_000_000_000).data
    benchmark.extra_info["bytes"] = len(data)

    decoded = benchmark(decode_wal_object, data)

    assert len(decoded.chunks) == STREAMS
