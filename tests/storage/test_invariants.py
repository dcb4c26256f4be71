"""Invariants 1, 2, 3, 6 and 7 of docs/design.md, on the embedded backends."""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from icefloe.config import Config
from icefloe.storage.engine import StreamStorage
from tests.support.storage import read_all, storage_config
from tests.support.storage_processes import (
    append_from_process,
    append_then_die_before_commit,
    idempotent_batch,
    tagged_records,
)

SPAWN = multiprocessing.get_context("spawn")


def assert_gapless(ranges: list[tuple[int, int]]) -> None:
    """(first offset, count) ranges tile [0, total) with no gap and no overlap."""
    expected = 0
    for first, count in sorted(ranges):
        assert first == expected, f"range starting at {first}, expected {expected}"
        expected += count


async def test_invariant_1_offsets_are_gapless_under_concurrent_appends(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    rng = random.Random(7)

    async def writer(w: int) -> list[tuple[int, int, str]]:
        done = []
        for i in range(15):
            count = rng.randint(1, 5)
            name = f"w{w}-{i}"
            done.append((await storage.append(stream, tagged_records(name, count)), count, name))
        return done

    appends = [a for r in await asyncio.gather(*(writer(w) for w in range(16))) for a in r]
    assert_gapless([(first, count) for first, count, _ in appends])
    total = sum(count for _, count, _ in appends)
    assert await storage.log_end(stream) == total
    by_offset = {r.offset: r.value for r in await read_all(storage, stream)}
    for first, count, name in appends:
        for i in range(count):
            assert by_offset[first + i] == f"{name}/{i}".encode()


async def test_invariant_2_read_your_writes_from_another_engine(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    await other_storage.read(stream, 0)  # warm the other engine's cache with "empty"
    for i in range(20):
        first = await storage.append(stream, tagged_records(f"ryw{i}", 2))
        seen = await other_storage.read_records(stream, first)
        assert [r.value for r in seen[:2]] == [f"ryw{i}/0".encode(), f"ryw{i}/1".encode()]


async def test_four_writers_in_two_processes_get_gapless_offsets_and_see_everything(
    tmp_path: Path,
) -> None:
    config = storage_config(tmp_path)
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("shared")
    appends_per_writer = 12
    per_writer = sum(1 + (i % 3) for i in range(appends_per_writer))
    total = 4 * per_writer
    with ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
        futures = [
            pool.submit(
                append_from_process, str(tmp_path), stream, tag, 2, appends_per_writer, total
            )
            for tag in ("p0", "p1")
        ]
        results = [f.result(timeout=120) for f in futures]
    appends = [tuple(a) for r in results for a in r["appends"]]
    assert_gapless([(first, count) for first, count, _ in appends])
    expected = sorted(
        (first + i, f"{name}/{i}".encode()) for first, count, name in appends for i in range(count)
    )
    for result in results:  # every record readable from both processes
        assert sorted(tuple(s) for s in result["seen"]) == expected


async def test_invariant_3_crash_between_wal_write_and_commit_leaves_nothing_visible(
    tmp_path: Path,
) -> None:
    settings = {"commit_deadline_s": 0.5, "orphan_grace_s": 1.5}
    config = storage_config(tmp_path, **settings)
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("s")
        await storage.append(stream, tagged_records("kept", 2))
        reader_errors: list[BaseException] = []
        stop = asyncio.Event()

        async def read_continuously() -> None:
            while not stop.is_set():
                try:
                    await storage.read_records(stream, 0)
                except Exception as exc:  # noqa: BLE001 - the invariant: a reader never fails
                    reader_errors.append(exc)
                await asyncio.sleep(0.01)

        reader = asyncio.create_task(read_continuously())
        child = SPAWN.Process(
            target=append_then_die_before_commit, args=(str(tmp_path), stream), kwargs=settings
        )
        child.start()
        await asyncio.to_thread(child.join, 60)
        assert child.exitcode == -9  # SIGKILL
        wal_refs = [info.ref async for info in storage.wal.list()]
        assert len(wal_refs) == 2  # the committed object and the orphan
        assert await storage.log_end(stream) == 2
        assert await storage.collect_orphans() == []  # still within the grace period
        await asyncio.sleep(1.6)
        orphans = await storage.collect_orphans()
        assert len(orphans) == 1
        assert [info.ref async for info in storage.wal.list()] == [
            ref for ref in wal_refs if ref not in orphans
        ]
        stop.set()
        await reader
        assert reader_errors == []
        assert [r.value for r in await storage.read_records(stream, 0)] == [b"kept/0", b"kept/1"]


async def test_invariant_6_collection_never_deletes_a_referenced_wal_object(
    tmp_path: Path,
) -> None:
    config = storage_config(tmp_path, commit_deadline_s=0.5, orphan_grace_s=0.6)
    async with await StreamStorage.open(config) as storage:
        streams = [await storage.create_stream(f"s{i}") for i in range(3)]
        for i in range(10):
            await asyncio.gather(
                *(storage.append(s, tagged_records(f"{s}-{i}", 2)) for s in streams)
            )
        orphan = await storage.wal.append(b"never committed")
        before = {info.ref async for info in storage.wal.list()}
        await asyncio.sleep(0.7)
        assert await storage.collect_orphans() == [orphan]
        assert {info.ref async for info in storage.wal.list()} == before - {orphan}
    async with await StreamStorage.open(config) as fresh:  # nothing cached: reads hit the WAL
        for s in streams:
            assert len(await fresh.read_records(s, 0)) == 20


async def test_invariant_7_a_retried_batch_through_another_engine_is_stored_once(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    pid = await storage.allocate_producer_id()
    first = await storage.append_batches(stream, idempotent_batch(pid, 0, 0))
    second = await storage.append_batches(stream, idempotent_batch(pid, 0, 3))
    assert (first, second) == (0, 3)
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 0
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 3)) == 3
    assert await storage.log_end(stream) == 6
    values = [r.value for r in await other_storage.read_records(stream, 0)]
    assert values == [f"seq{i}".encode() for i in range(6)]


async def test_producer_ids_are_unique_across_engines(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    ids = await asyncio.gather(*(e.allocate_producer_id() for e in [storage, other_storage] * 20))
    assert len(set(ids)) == 40


async def test_configuration_objects_are_reusable(config: Config) -> None:
    async with await StreamStorage.open(config) as one, await StreamStorage.open(config) as two:
        stream = await one.create_stream("s")
        await one.append(stream, tagged_records("x", 1))
        assert await two.log_end(stream) == 1


async def test_a_stalled_commit_past_the_deadline_fails_and_stores_nothing(tmp_path: Path) -> None:
    config = storage_config(tmp_path, commit_deadline_s=0.2, orphan_grace_s=1.0)
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("s")
        real_append = storage.wal.append_parts

        async def slow_append(parts: Sequence[bytes | memoryview]) -> str:
            ref = await real_append(parts)
            await asyncio.sleep(0.3)  # durable, but too late to be committed
            return ref

        storage.wal.append_parts = slow_append  # type: ignore[method-assign]
        started = time.monotonic()
        with pytest.raises(Exception, match="commit_deadline_s") as exc:
            await storage.append(stream, tagged_records("late", 1))
        assert exc.value.retriable  # type: ignore[attr-defined]
        assert time.monotonic() - started < 5
        assert await storage.log_end(stream) == 0
