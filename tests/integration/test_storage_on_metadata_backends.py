"""Stream storage with its offset index in Oxia or etcd instead of the embedded SQLite store.

The configuration differs from the embedded default only in ``[metadata]``. The outage tests
freeze a dedicated server (SIGSTOP) in the middle of a run of appends: appends may fail with a
retriable error or wait, never return an offset that was not committed, and the adapter must
reconnect by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from icefloe.config import Config, load_config
from icefloe.errors import IcefloeError
from icefloe.storage.engine import StreamStorage
from tests.storage.test_invariants import assert_gapless
from tests.support.metadata_servers import (
    MetadataServer,
    shared_etcd,
    shared_oxia,
    start_etcd,
    start_oxia,
)
from tests.support.storage import read_all
from tests.support.storage_processes import idempotent_batch, tagged_records

BACKENDS = ["oxia", "etcd"]
SHARED: dict[str, Callable[[], MetadataServer]] = {"oxia": shared_oxia, "etcd": shared_etcd}
DEDICATED: dict[str, Callable[[Path], MetadataServer]] = {"oxia": start_oxia, "etcd": start_etcd}
OUTAGE_S = 5.0


def backend_config(data_dir: Path, backend: str, server: MetadataServer, **extra: Any) -> Config:
    """The test default (tests/support/storage.py) with ``[metadata]`` pointing at ``server``."""
    namespace = f"storage-{data_dir.name}"
    options = (
        server.oxia_options(namespace, **extra)
        if backend == "oxia"
        else server.etcd_options(namespace, **extra)
    )
    return load_config(
        env={},
        overrides={
            "data_dir": str(data_dir),
            "storage": {"flush_interval_ms": 2},
            "metadata": {"backend": backend, backend: options},
        },
    )


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Config:
    return backend_config(tmp_path, request.param, SHARED[request.param]())


@pytest.fixture
async def storage(config: Config) -> AsyncIterator[StreamStorage]:
    async with await StreamStorage.open(config) as opened:
        yield opened


@pytest.fixture
async def other_storage(config: Config) -> AsyncIterator[StreamStorage]:
    async with await StreamStorage.open(config) as opened:
        yield opened


async def test_concurrent_appends_get_gapless_offsets_and_read_back(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")

    async def writer(w: int) -> list[tuple[int, int, str]]:
        done = []
        for i in range(10):
            name, count = f"w{w}-{i}", 1 + (w + i) % 4
            done.append((await storage.append(stream, tagged_records(name, count)), count, name))
        return done

    appends = [a for r in await asyncio.gather(*(writer(w) for w in range(8))) for a in r]
    assert_gapless([(first, count) for first, count, _ in appends])
    assert await storage.log_end(stream) == sum(count for _, count, _ in appends)
    by_offset = {r.offset: r.value for r in await read_all(storage, stream)}
    for first, count, name in appends:
        for i in range(count):
            assert by_offset[first + i] == f"{name}/{i}".encode()


async def test_a_retried_idempotent_batch_through_another_engine_is_stored_once(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    pid = await storage.allocate_producer_id()
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 0
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 3)) == 3
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 0
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 3)) == 3
    assert await storage.log_end(stream) == 6
    values = [r.value for r in await other_storage.read_records(stream, 0)]
    assert values == [f"seq{i}".encode() for i in range(6)]


@pytest.fixture(params=BACKENDS)
def dedicated(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, MetadataServer]]:
    server = DEDICATED[request.param](tmp_path / "server")
    try:
        yield request.param, server
    finally:
        server.process.resume()  # harmless if running; a stopped process cannot be killed
        server.process.stop()


async def test_appends_survive_a_frozen_metadata_server(
    dedicated: tuple[str, MetadataServer], tmp_path: Path
) -> None:
    backend, server = dedicated
    # Short timeouts so that appends during the outage fail fast instead of piling up.
    config = backend_config(tmp_path / "data", backend, server, request_timeout=1.0)
    succeeded: list[tuple[int, int, str]] = []
    failed: list[IcefloeError] = []
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("s")
        stop = asyncio.Event()

        async def append_until_stopped(w: int) -> None:
            i = 0
            while not stop.is_set():
                name = f"w{w}-{i}"
                i += 1
                try:
                    first = await storage.append(stream, tagged_records(name, 2))
                except IcefloeError as exc:
                    failed.append(exc)
                    await asyncio.sleep(0.1)
                else:
                    succeeded.append((first, 2, name))

        writers = [asyncio.create_task(append_until_stopped(w)) for w in range(4)]
        await wait_for(lambda: len(succeeded) >= 20, "appends before the outage")
        server.process.pause()
        at_pause = len(succeeded)
        await asyncio.sleep(OUTAGE_S)
        before_resume = len(succeeded)
        server.process.resume()
        # At most the appends whose commit was answered just before the freeze.
        assert before_resume - at_pause <= len(writers), "appends succeeded while frozen"
        await wait_for(lambda: len(succeeded) >= before_resume + 20, "appends after the outage")
        stop.set()
        await asyncio.gather(*writers)

        assert all(exc.retriable for exc in failed), [repr(exc) for exc in failed]
        # Every acknowledged append is there, at the offset it was given.
        records = await read_all(storage, stream)
        by_offset = {r.offset: r.value for r in records}
        for first, count, name in succeeded:
            for i in range(count):
                assert by_offset[first + i] == f"{name}/{i}".encode()
        # Offsets stay gapless even if an append that timed out was committed after all.
        assert [r.offset for r in records] == list(range(await storage.log_end(stream)))


async def wait_for(condition: Callable[[], bool], what: str, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {within} s")
        await asyncio.sleep(0.05)
