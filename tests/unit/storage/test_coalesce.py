"""Reads of one WAL object asked for together are one read of their span."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from icefloe.errors import NotFoundError
from icefloe.ports.wal import WAL, WalObjectInfo
from icefloe.storage.coalesce import CoalescedReads

OBJECT = bytes(range(256)) * 64  # 16 KiB, every byte telling where it is


class CountingWal(WAL):
    """A WAL of one object in memory that records each ranged read it serves."""

    def __init__(self, missing: bool = False) -> None:
        self.reads: list[tuple[str, int, int | None]] = []
        self.missing = missing

    async def _read(self, ref: str, start: int, end: int | None) -> bytes:
        self.reads.append((ref, start, end))
        await asyncio.sleep(0)
        if self.missing:
            raise NotFoundError(f"WAL object {ref!r} does not exist")
        return OBJECT[start:end]

    async def _append(self, data: bytes | bytearray | memoryview) -> str:
        raise NotImplementedError

    async def _delete(self, ref: str) -> None:
        raise NotImplementedError

    async def _list(self) -> AsyncIterator[WalObjectInfo]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def close(self) -> None:
        pass


async def test_reads_of_one_object_asked_together_are_one_read_of_their_span() -> None:
    wal = CountingWal()
    reads = CoalescedReads(wal, max_gap=1024)
    ranges = [(4096, 6000), (100, 2000), (2000, 4096), (6500, 7000)]

    got = await asyncio.gather(*(reads.read("a", s, e) for s, e in ranges))

    assert wal.reads == [("a", 100, 7000)]
    assert [bytes(g) for g in got] == [OBJECT[s:e] for s, e in ranges]


async def test_a_read_asked_alone_reads_only_its_range() -> None:
    wal = CountingWal()
    reads = CoalescedReads(wal)

    assert bytes(await reads.read("a", 10, 20)) == OBJECT[10:20]
    assert bytes(await reads.read("a", 30, 40)) == OBJECT[30:40]
    assert wal.reads == [("a", 10, 20), ("a", 30, 40)]


async def test_ranges_far_apart_or_in_other_objects_are_read_apart() -> None:
    wal = CountingWal()
    reads = CoalescedReads(wal, max_gap=1000)

    got = await asyncio.gather(
        reads.read("a", 0, 10), reads.read("a", 5000, 5010), reads.read("b", 0, 10)
    )

    assert sorted(wal.reads) == [("a", 0, 10), ("a", 5000, 5010), ("b", 0, 10)]
    assert [bytes(g) for g in got] == [OBJECT[0:10], OBJECT[5000:5010], OBJECT[0:10]]


async def test_the_error_of_a_shared_read_reaches_every_caller() -> None:
    reads = CoalescedReads(CountingWal(missing=True))

    got = await asyncio.gather(
        reads.read("a", 0, 10), reads.read("a", 10, 20), return_exceptions=True
    )

    assert [type(g) for g in got] == [NotFoundError, NotFoundError]


async def test_a_caller_that_gives_up_leaves_the_others_their_bytes() -> None:
    wal = CountingWal()
    reads = CoalescedReads(wal)
    dropped, kept = reads.read("a", 0, 10), reads.read("a", 10, 20)
    dropped.cancel()

    assert bytes(await kept) == OBJECT[10:20]
    with pytest.raises(asyncio.CancelledError):
        await dropped


async def test_nothing_is_read_for_callers_that_all_gave_up() -> None:
    wal = CountingWal()
    reads = CoalescedReads(wal)
    reads.read("a", 0, 10).cancel()
    await asyncio.sleep(0.01)

    assert wal.reads == []


async def test_close_cancels_the_reads_in_flight() -> None:
    class StuckWal(CountingWal):
        async def _read(self, ref: str, start: int, end: int | None) -> bytes:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    reads = CoalescedReads(StuckWal())
    waiting = reads.read("a", 0, 10)
    await asyncio.sleep(0.01)
    await reads.close()

    with pytest.raises(asyncio.CancelledError):
        await waiting
