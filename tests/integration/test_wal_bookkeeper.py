"""Stream storage and compaction on the BookKeeper WAL, and its faults: a bookie killed while
records are produced, ZooKeeper unavailable for a while. One shared cluster of three bookies
(tests/support/bookkeeper.py); a test that breaks a server restores it before it ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from icefloe_wal_bookkeeper.refs import parse
from icefloe_wal_bookkeeper.wal import ENTRY_SIZE, SIZE

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.errors import NotFoundError, UnavailableError
from icefloe.ports.base import PortKind
from icefloe.ports.wal import WAL
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation, WalLocation
from icefloe.storage.records import Record
from icefloe.testing.contract import open_backend
from icefloe.topics.registry import TopicRegistry
from tests.support.bookkeeper import BookKeeperCluster, shared_bookkeeper
from tests.support.storage import read_all

pytestmark = pytest.mark.slow


def bookkeeper_config(data_dir: Path, *, wal: dict[str, Any], **storage: Any) -> Config:
    """The embedded defaults but for ``[wal] backend = "bookkeeper"``."""
    return load_config(
        env={},
        overrides={
            "data_dir": str(data_dir),
            "storage": {"flush_interval_ms": 2, "wal_cache_bytes": 0, **storage},
            "wal": {"backend": "bookkeeper", "bookkeeper": wal},
            "table": {"formats": []},
        },
    )


def records(n: int, tag: str, value_size: int = 100) -> list[Record]:
    return [
        Record(
            i,
            1_700_000_000_000 + i,
            f"{tag}-{i}".encode(),
            f"value-{tag}-{i}".encode().ljust(value_size, b"."),
            (),
        )
        for i in range(n)
    ]


def comparable(rs: list[Record]) -> list[tuple[object, ...]]:
    return [(r.offset, r.timestamp, r.key, r.value) for r in rs]


# Long enough for a commit on a loaded machine; the grace period that follows is waited out.
ORPHAN_TEST_DEADLINE_S = 5.0
ENSEMBLE_CHANGE_TRIES = 4
"""Bookie kills under large writes before the test gives up on catching one mid-write."""


@pytest.fixture
def cluster() -> BookKeeperCluster:
    return shared_bookkeeper()


@pytest.fixture
def namespace() -> str:
    return f"it-{uuid.uuid4().hex[:10]}"


async def test_compaction_reads_the_ledgers_and_releases_them(
    tmp_path: Path, cluster: BookKeeperCluster, namespace: str
) -> None:
    config = bookkeeper_config(
        tmp_path,
        wal=cluster.wal_options(namespace),
        commit_deadline_s=ORPHAN_TEST_DEADLINE_S,
        orphan_grace_s=ORPHAN_TEST_DEADLINE_S + 0.5,
    )
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            topic = await topics.create("orders", 2)
            await storage.wal.delete(await storage.wal.append(b"warm-up"))  # classes loaded
            for round_ in range(3):
                for stream in topic.streams:
                    await storage.append(stream, records(50, f"r{round_}-s{stream}"))
            written = time.monotonic()
            before = {s: await read_all(storage, s) for s in topic.streams}
            ledgers = {
                entry.location.ref
                for s in topic.streams
                for entry in await storage.index.scan(s)
                if isinstance(entry.location, WalLocation)
            }
            assert ledgers
            assert {parse(ref).ledger_id for ref in ledgers}  # references of this WAL

            assert await compactor.until_idle() >= 1  # a worker process reads the ledgers
            for stream in topic.streams:
                entries = await storage.index.scan(stream)
                assert {type(e.location) for e in entries} == {ParquetLocation}
            # Every ledger is past the grace period this long after the last write.
            past_grace = ORPHAN_TEST_DEADLINE_S + 0.6 - (time.monotonic() - written)
            await asyncio.sleep(max(0.0, past_grace))
            assert set(await storage.collect_orphans()) >= ledgers
            assert [info async for info in storage.wal.list()] == []
            for ref in ledgers:
                with pytest.raises(NotFoundError):
                    await storage.wal.read(ref)
            for stream in topic.streams:
                assert comparable(await read_all(storage, stream)) == comparable(before[stream])
        finally:
            await compactor.close()
            await topics.close()


async def test_a_bookie_killed_mid_run_loses_no_acknowledged_record(
    tmp_path: Path, cluster: BookKeeperCluster, namespace: str
) -> None:
    # Ledgers on two of the three bookies: losing one leaves enough for an ensemble change.
    # Objects of many small entries, so that some are half written when the bookie dies.
    wal_options = cluster.wal_options(
        namespace, ensemble=2, write_quorum=2, ack_quorum=2, request_timeout=30, entry_size=4096
    )
    config = bookkeeper_config(tmp_path, wal=wal_options)
    acknowledged: dict[int, list[Record]] = {}
    failures: list[Exception] = []
    stop = asyncio.Event()
    large_refs: list[str] = []
    changed: list[int] = []

    async def produce(storage: StreamStorage, stream: int) -> None:
        acknowledged[stream] = []
        n = 0
        while not stop.is_set():
            batch = records(20, f"s{stream}-{n}", value_size=2_000)
            try:
                base = await storage.append(stream, batch)
            except UnavailableError as exc:  # retriable: a producer would retry
                failures.append(exc)
                await asyncio.sleep(0.1)
                continue
            acknowledged[stream].extend(
                Record(base + i, r.timestamp, r.key, r.value, r.headers)
                for i, r in enumerate(batch)
            )
            n += 1

    async def until(condition: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, "producers made no progress"
            await asyncio.sleep(0.05)

    def acked() -> int:
        return sum(len(rs) for rs in acknowledged.values())

    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        try:
            topic = await topics.create("orders", 4)
            producers = [asyncio.create_task(produce(storage, s)) for s in topic.streams]
            try:
                await until(lambda: acked() >= 400, 60)
                # Large objects half written when the bookie dies: a ledger on that bookie must
                # change ensemble at an entry past the first. The kill waits until one is seen
                # mid-write; if the bookie still dies between its writes, it comes back and dies
                # again under new ones.
                big = os.urandom(4 << 20)
                for attempt in range(ENSEMBLE_CHANGE_TRIES):
                    if attempt:
                        await asyncio.to_thread(cluster.restart_bookie, 0)
                    large = await _kill_bookie_mid_write(storage.wal, cluster, big)
                    at_kill = acked()
                    refs = await asyncio.gather(*large)
                    large_refs.extend(refs)
                    await until(lambda: acked() >= at_kill + 1_000, 60)  # noqa: B023
                    changed = await asyncio.to_thread(
                        _ledgers_with_an_ensemble_change, storage.wal, set(refs)
                    )
                    if changed:
                        break
            finally:
                stop.set()
                await asyncio.gather(*producers)
            assert changed, f"no large ledger changed its ensemble mid-write in {attempt + 1} tries"
            for ref in large_refs:
                assert await storage.wal.read(ref) == big
        finally:
            await topics.close()
        try:
            assert all(exc.retriable for exc in failures)
            # Every acknowledged record, read back by another engine from the bookies left.
            async with await StreamStorage.open(config) as fresh:
                for stream, expected in acknowledged.items():
                    got = await read_all(fresh, stream)
                    assert comparable(got) == comparable(expected)
        finally:
            await asyncio.to_thread(cluster.restart_bookie, 0)


@contextlib.contextmanager
def _ledgers_created(wal: WAL) -> Iterator[list[Any]]:
    """The write handles of the ledgers ``wal`` creates meanwhile (its internals: a test of the
    plugin watching its own ledgers fill)."""
    created: list[Any] = []
    original = wal._java  # type: ignore[attr-defined]

    async def java(what: str, future: Any, **kwargs: Any) -> Any:
        result = await original(what, future, **kwargs)
        if what == "create a ledger":
            created.append(result)
        return result

    wal._java = java  # type: ignore[attr-defined]
    try:
        yield created
    finally:
        del wal._java  # type: ignore[attr-defined]


async def _kill_bookie_mid_write(
    wal: WAL, cluster: BookKeeperCluster, big: bytes
) -> list[asyncio.Task[str]]:
    """Appends ``big`` until bookie 0 dies in the middle of one of them; the appends.

    A ledger's last confirmed entry trails what its bookies hold, so a kill timed by it alone
    may land after the bookie took the last entry. Frozen first, the bookie acknowledges
    nothing more: a ledger on it still unfinished once the acknowledgements already sent have
    arrived is one the kill cuts in the middle."""
    victim = f"127.0.0.1:{cluster.bookie_ports[0]}"
    large: list[asyncio.Task[str]] = []
    watched: list[tuple[Any, int]] = []  # handle and entry count, of large objects on the victim

    def mid_write() -> bool:
        return any(0 <= h.getLastAddConfirmed() < entries - 1 for h, entries in watched)

    deadline = time.monotonic() + 60
    with _ledgers_created(wal) as created:
        while True:
            assert time.monotonic() < deadline, "no large ledger on bookie 0 caught mid-write"
            if all(task.done() for task in large):
                large += [asyncio.create_task(wal.append(big)) for _ in range(3)]
            while created:
                handle = created.pop()
                metadata = handle.getLedgerMetadata()
                custom = metadata.getCustomMetadata()
                if bytes(custom.get(SIZE)) != str(len(big)).encode():
                    continue  # a producer's small object
                if victim in (str(bookie) for bookie in metadata.getEnsembleAt(0)):
                    entries = -(-len(big) // int(bytes(custom.get(ENTRY_SIZE))))
                    watched.append((handle, entries))
            if mid_write():
                await asyncio.to_thread(cluster.pause_bookie, 0)
                await asyncio.sleep(0.5)  # acknowledgements on their way arrive
                if mid_write():
                    await asyncio.to_thread(cluster.kill_bookie, 0)
                    return large
                cluster.resume_bookie(0)
            await asyncio.sleep(0.001)


def _ledgers_with_an_ensemble_change(wal: WAL, refs: set[str]) -> list[int]:
    """Ledgers whose metadata holds more than one ensemble (a bookie was replaced)."""
    client = wal._client  # type: ignore[attr-defined]
    changed = []
    for ref in refs:
        ledger_id = parse(ref).ledger_id
        metadata = client.getLedgerMetadata(ledger_id).get()
        if metadata.getAllEnsembles().size() > 1:
            changed.append(ledger_id)
    return changed


@pytest.fixture
async def quick_wal(
    tmp_path: Path, cluster: BookKeeperCluster, namespace: str
) -> AsyncIterator[WAL]:
    options = cluster.wal_options(namespace, request_timeout=2, zk_session_timeout=10)
    wal = await open_backend(PortKind.WAL, "bookkeeper", tmp_path, options)
    assert isinstance(wal, WAL)
    try:
        yield wal
    finally:
        await wal.close()


async def test_zookeeper_unavailable_is_a_retriable_error_then_recovers(
    quick_wal: WAL, cluster: BookKeeperCluster
) -> None:
    wal = quick_wal
    before = await wal.append(b"before the outage")
    cluster.pause_zookeeper()
    try:
        started = time.monotonic()
        with pytest.raises(UnavailableError, match="request_timeout") as caught:
            await wal.append(b"during the outage")
        assert caught.value.retriable
        assert time.monotonic() - started < 5  # bounded by request_timeout, never a hang
        with pytest.raises(UnavailableError):
            await wal.read(before)
    finally:
        cluster.resume_zookeeper()
    deadline = time.monotonic() + 20
    while True:
        try:
            after = await wal.append(b"after the outage")
            break
        except UnavailableError:
            assert time.monotonic() < deadline, "no recovery within 20 s of ZooKeeper's return"
            await asyncio.sleep(0.2)
    assert await wal.read(before) == b"before the outage"
    assert await wal.read(after) == b"after the outage"
    assert {before, after} <= {info.ref async for info in wal.list()}
