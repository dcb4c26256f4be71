"""PUT and ranged-GET throughput and latency of the cloud object stores, against the emulators.

Per backend: PUT of 4 MiB objects (a cost-mode WAL object) and GET of 64 KiB ranges (a fetch
of one stream's chunk). ``extra_info`` holds the bytes per operation, the throughput in MiB/s
and the p99 latency in ms; the same figures are printed. Run with::

    .venv/bin/pytest tests/bench/test_bench_object_stores.py --benchmark-enable -s

The figures measure the emulators as much as the adapters (moto, fake-gcs-server and Azurite
keep objects in memory, on the same two cores as the client): compare backends with care,
and never read them as cloud figures. Without ``--benchmark-enable`` each benchmark runs once,
as a test of the request counters.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.testing.contract import Contract, open_backend
from tests.support.object_servers import (
    BUCKET,
    MOTO_CREDENTIALS,
    azurite,
    azurite_connection_string,
    fake_gcs,
    moto,
)

OBJECT_SIZE = 4 << 20
RANGE_SIZE = 64 << 10
PUT_ROUNDS = 40
GET_ROUNDS = 300


def options_for(backend: str, prefix: str) -> dict[str, Any]:
    if backend == "s3":
        return {
            "bucket": BUCKET,
            "prefix": prefix,
            "endpoint_url": moto().url,
            "region": "us-east-1",
            "addressing_style": "path",
            **MOTO_CREDENTIALS,
        }
    if backend == "gcs":
        return {"bucket": BUCKET, "prefix": prefix, "endpoint": fake_gcs().url, "anonymous": True}
    return {
        "container": BUCKET,
        "prefix": prefix,
        "connection_string": azurite_connection_string(azurite().url),
    }


@pytest.fixture(params=["s3", "gcs", "azure"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ObjectStore, Any]]:
    """A store on one emulator, and the event loop that drives it (benchmarks are sync)."""
    runner = asyncio.Runner()
    options = options_for(request.param, Contract.new_unique())
    opened = runner.run(open_backend(PortKind.OBJECT_STORE, request.param, tmp_path, options))
    assert isinstance(opened, ObjectStore)
    try:
        yield opened, runner
    finally:
        runner.run(opened.close())
        runner.close()


def report(benchmark: BenchmarkFixture, name: str, nbytes: int) -> None:
    """Throughput and p99 into ``extra_info`` (and on stdout), when the benchmark ran."""
    stats = getattr(benchmark, "stats", None)
    data = sorted(getattr(getattr(stats, "stats", None), "data", []) or [])
    if len(data) < 2:
        return  # benchmarks disabled: one plain run
    p99 = statistics.quantiles(data, n=100)[98]
    mean = statistics.fmean(data)
    benchmark.extra_info.update(
        bytes=nbytes, mib_per_s=round(nbytes / mean / (1 << 20), 1), p99_ms=round(p99 * 1000, 2)
    )
    print(
        f"\n{name}: {len(data)} ops, mean {mean * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms, "
        f"{nbytes / mean / (1 << 20):.1f} MiB/s"
    )


def test_put_4mib(benchmark: BenchmarkFixture, store: tuple[ObjectStore, Any]) -> None:
    objects, runner = store
    payload = random.Random(1).randbytes(OBJECT_SIZE)
    names = (f"put/{index:06d}" for index in range(1_000_000))
    before = objects.stats.snapshot()

    benchmark.pedantic(
        lambda: runner.run(objects.put(next(names), payload)), rounds=PUT_ROUNDS, iterations=1
    )

    report(benchmark, f"{type(objects).__name__} PUT 4 MiB", OBJECT_SIZE)
    rounds = len(benchmark.stats.stats.data) if benchmark.stats else 1
    after = objects.stats.snapshot()
    # One request per 4 MiB PUT (a single request below the part size), all counted.
    assert after["requests"]["PUT"] - before["requests"]["PUT"] == rounds
    assert after["bytes"]["PUT"] - before["bytes"]["PUT"] == rounds * OBJECT_SIZE


def test_get_64kib_range(benchmark: BenchmarkFixture, store: tuple[ObjectStore, Any]) -> None:
    objects, runner = store
    runner.run(objects.put("get/object", random.Random(2).randbytes(OBJECT_SIZE)))
    starts = random.Random(3)
    before = objects.stats.snapshot()

    def ranged_get() -> bytes:
        start = starts.randrange(0, OBJECT_SIZE - RANGE_SIZE)
        return runner.run(objects.get("get/object", start, start + RANGE_SIZE))

    data = benchmark.pedantic(ranged_get, rounds=GET_ROUNDS, iterations=1)

    assert len(data) == RANGE_SIZE
    report(benchmark, f"{type(objects).__name__} GET 64 KiB range", RANGE_SIZE)
    rounds = len(benchmark.stats.stats.data) if benchmark.stats else 1
    after = objects.stats.snapshot()
    assert after["requests"]["GET"] - before["requests"]["GET"] == rounds
    assert after["bytes"]["GET"] - before["bytes"]["GET"] == rounds * RANGE_SIZE
