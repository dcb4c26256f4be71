"""Sequenced appends on each metadata backend: one at a time, and with 64 in flight.

Each round appends to one offset-index-like sequence (two components, as stream storage does).
``extra_info`` holds appends per second and the p50/p99 latency of single appends over all
rounds. Run with::

    .venv/bin/pytest tests/bench/test_bench_metadata.py --benchmark-enable \\
        --benchmark-columns=mean,rounds -s

Oxia and etcd run on this machine's loopback (Oxia without WAL fsync, etcd with its default
fsync), so the figures compare adapters and servers, not networks.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.ports.base import PortKind
from icefloe.ports.metadata import MetadataStore
from icefloe.testing.contract import Contract, open_backend
from tests.support.metadata_servers import shared_etcd, shared_oxia

APPENDS_PER_ROUND = 256
ROUNDS = 3
VALUE = bytes(200)  # about the size of an index entry


def options(backend: str, workdir: Path) -> dict[str, Any]:
    unique = Contract.new_unique()
    if backend == "oxia":
        return shared_oxia().oxia_options(unique)
    if backend == "etcd":
        return shared_etcd().etcd_options(unique)
    return {"path": str(workdir / "meta.db")}


@pytest.fixture
def store_runner(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[asyncio.Runner, MetadataStore]]:
    runner = asyncio.Runner()
    backend = request.node.callspec.params["backend"]
    opened = runner.run(
        open_backend(PortKind.METADATA, backend, tmp_path, options(backend, tmp_path))
    )
    assert isinstance(opened, MetadataStore)
    try:
        yield runner, opened
    finally:
        runner.run(opened.close())
        runner.close()


@pytest.mark.parametrize("in_flight", [1, 64])
@pytest.mark.parametrize("backend", ["sqlite", "oxia", "etcd"])
def test_sequenced_appends(
    benchmark: BenchmarkFixture,
    store_runner: tuple[asyncio.Runner, MetadataStore],
    backend: str,
    in_flight: int,
) -> None:
    runner, store = store_runner
    latencies: list[float] = []
    rounds = iter(range(1_000_000))

    async def timed_append(prefix: str) -> None:
        started = time.perf_counter()
        await store.append_sequence(prefix, VALUE, (3, len(VALUE)))
        latencies.append(time.perf_counter() - started)

    async def one_round() -> None:
        prefix = f"streams/{next(rounds):012d}/index"
        pending = iter(range(APPENDS_PER_ROUND))

        async def worker() -> None:
            for _ in pending:
                await timed_append(prefix)

        await asyncio.gather(*(worker() for _ in range(in_flight)))

    run: Callable[[], None] = lambda: runner.run(one_round())  # noqa: E731
    benchmark.pedantic(run, rounds=ROUNDS, iterations=1, warmup_rounds=1)

    assert latencies
    quantiles = statistics.quantiles(latencies, n=100)
    benchmark.extra_info.update(
        appends_per_round=APPENDS_PER_ROUND,
        appends_per_s=round(APPENDS_PER_ROUND / benchmark.stats.stats.mean)
        if benchmark.enabled
        else None,
        p50_ms=round(quantiles[49] * 1000, 2),
        p99_ms=round(quantiles[98] * 1000, 2),
    )
    if benchmark.enabled:
        print(
            f"\n{backend:6} in_flight={in_flight:2}: {benchmark.extra_info['appends_per_s']:>6} "
            f"appends/s, p50 {benchmark.extra_info['p50_ms']} ms, "
            f"p99 {benchmark.extra_info['p99_ms']} ms"
        )
