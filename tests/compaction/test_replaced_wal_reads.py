"""Reads of records that compaction just moved into a data file take the producer's bytes
from the WAL objects while they last, in the process that cached their entries; any other
reader, or one after the objects are gone, the file cleaned or the time up, reads the file."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import Config
from icefloe.ports.object_store import RequestKind
from icefloe.storage.batch import Compression
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import IndexEntry, WalLocation
from icefloe.storage.records import Record
from icefloe.storage.transactions import COMMIT, control_batch
from icefloe.topics.registry import TopicRegistry
from tests.support.storage import count_wal_reads, read_all

Parts = tuple[StreamStorage, TopicRegistry, Compactor]
ON = {"replaced_wal_reads_s": 60, "orphan_grace_s": 600}
"""Replaced entries kept a minute (the compaction tests' orphan grace would cut it short)."""
DAY = 86_400_000


def keep_replaced(**more: object) -> pytest.MarkDecorator:
    return pytest.mark.parametrize("config", [ON | more], indirect=True)


async def compacted(parts: Parts, batches: int = 4) -> tuple[int, list[IndexEntry], bytes]:
    """A stream of ``batches`` zstd batches, each its own WAL entry, compacted into one data
    file, once this process heard of the swap: the stream, its WAL entries as they were, and
    the bytes a read of it returned before compaction."""
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    for b in range(batches):
        values = [os.urandom(200).hex().encode() for _ in range(10)]
        await storage.append(
            stream,
            [Record(i, 1_700_000_000_000 + b, None, v) for i, v in enumerate(values)],
            compression=Compression.ZSTD,
        )
    wal_entries = await storage.index.scan(stream)
    assert len(wal_entries) == batches
    assert all(e.in_wal for e in wal_entries)
    before = bytes((await storage.read(stream, 0)).data)
    await compactor.until_idle()
    await swap_heard(storage, stream)
    return stream, wal_entries, before


async def swap_heard(storage: StreamStorage, stream: int) -> IndexEntry:
    """The data file's entry, once ``storage`` has applied every notification of the swap (the
    entry of offset 0 is the last one it deletes)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        entry = await storage.index.entry_for(stream, 0)
        if entry is not None and not entry.in_wal:
            return entry
        await asyncio.sleep(0.02)
    raise AssertionError("the swap's notifications did not arrive")


def gets(storage: StreamStorage) -> int:
    """Object-store GETs so far: the data files are there, the WAL is not (the local WAL)."""
    return storage.object_store.stats.requests[RequestKind.GET]


@keep_replaced()
async def test_a_read_after_the_swap_returns_the_producers_bytes_from_the_wal(
    parts: Parts,
) -> None:
    storage = parts[0]
    stream, _, before = await compacted(parts)
    read_before = gets(storage)
    after = await storage.read(stream, 0)
    # The zstd batches as produced (a rebuild from the data file is uncompressed), and the
    # data file never opened.
    assert bytes(after.data) == before
    assert gets(storage) == read_before


@keep_replaced()
async def test_another_process_reads_the_data_file(parts: Parts, config: Config) -> None:
    stream, _, before = await compacted(parts)
    async with await StreamStorage.open(config) as other:
        read_before = gets(other)
        expected = await read_all(parts[0], stream)
        assert await read_all(other, stream) == expected
        assert gets(other) > read_before
        assert bytes((await other.read(stream, 0)).data) != before  # rebuilt, uncompressed


@keep_replaced(wal_cache_bytes=0)
async def test_a_replaced_entry_whose_object_is_gone_falls_back_to_the_data_file(
    parts: Parts,
) -> None:
    storage = parts[0]
    stream, wal_entries, _ = await compacted(parts)
    expected = await read_all(storage, stream)
    for ref in {e.location.ref for e in wal_entries if isinstance(e.location, WalLocation)}:
        await storage.wal.delete(ref)  # as garbage collection does past the grace period
    read_before = gets(storage)
    assert await read_all(storage, stream) == expected
    assert gets(storage) > read_before
    # Forgotten once found gone: the next read goes straight to the data file.
    wal_reads = count_wal_reads(storage.wal)
    assert await read_all(storage, stream) == expected
    assert wal_reads == []


@keep_replaced(replaced_wal_reads_s=0.2)
async def test_replaced_entries_are_kept_only_for_the_setting(parts: Parts) -> None:
    storage = parts[0]
    stream, _, before = await compacted(parts)
    await asyncio.sleep(0.3)
    read_before = gets(storage)
    assert bytes((await storage.read(stream, 0)).data) != before
    assert gets(storage) > read_before


@keep_replaced(replaced_wal_reads_s=0)
async def test_a_setting_of_zero_reads_the_data_file_at_once(parts: Parts) -> None:
    storage = parts[0]
    stream, _, before = await compacted(parts)
    read_before = gets(storage)
    assert bytes((await storage.read(stream, 0)).data) != before
    assert gets(storage) > read_before


@keep_replaced()
async def test_a_data_file_that_log_compaction_cleaned_is_read_cleaned(parts: Parts) -> None:
    """Reading the WAL entries the first swap replaced would bring back the records that
    cleaning removed."""
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1, {"cleanup.policy": "compact"})).streams[0]
    now = int(time.time() * 1000)
    for round_ in range(3):
        await storage.append(
            stream, [Record(i, now - 3 * DAY, b"k", b"r%d" % round_) for i in range(2)]
        )
        await compactor.until_idle()
    await swap_heard(storage, stream)
    assert len(await storage.read_records(stream, 0)) == 6
    assert await compactor.clean_once() is not None
    assert [(r.offset, r.value) for r in await storage.read_records(stream, 0)] == [(5, b"r2")]


@keep_replaced()
async def test_a_read_past_the_kept_entries_into_the_data_file_repeats_no_record(
    parts: Parts, config: Config
) -> None:
    """A marker another broker wrote is not kept here, and the data file dropped it: the
    rebuilt batch before it reaches over its offset. A read must not go on from the kept
    entries into that batch, which starts before where they ended."""
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, [Record(i, 0, None, b"a%d" % i) for i in range(3)])
    async with await StreamStorage.open(config) as other:
        assert await other.append_control(stream, control_batch(7, 0, COMMIT)) == 3
    await storage.append(stream, [Record(i, 0, None, b"c%d" % i) for i in range(3)])
    await compactor.until_idle()
    await swap_heard(storage, stream)
    first = await storage.read(stream, 0)
    assert first.next_offset == 3  # the kept entry's records, then the next read
    assert [r.offset for r in await read_all(storage, stream)] == [0, 1, 2, 4, 5, 6]
