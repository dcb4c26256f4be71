"""Stream storage used as a library, on the embedded backends."""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from kio.schema.errors import ErrorCode
from prometheus_client import REGISTRY

from icefloe.config import Config, load_config
from icefloe.config.storage import FlushProfile, StorageOptions
from icefloe.errors import ConflictError, NotFoundError
from icefloe.ports.metadata import EventKind
from icefloe.storage import index, index_reader, keys, walformat
from icefloe.storage.batch import ATTRIBUTES_AT, CRC_AT, BatchError, Compression, read_header
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.offset_index import NewPiece
from icefloe.storage.reader import OffsetOutOfRange
from icefloe.storage.records import Record, build_batch
from tests.support.kafka_wire import batch_with_deltas
from tests.support.storage import count_wal_reads, storage_config


def records(n: int, *, start_ts: int = 1_700_000_000_000, tag: str = "r") -> list[Record]:
    return [
        Record(
            i,
            start_ts + i,
            f"{tag}-key-{i}".encode(),
            f"{tag}-value-{i}".encode() * 3,
            (("h", f"{i}".encode()), ("h", None)),
        )
        for i in range(n)
    ]


def comparable(rs: list[Record]) -> list[tuple[object, ...]]:
    return [(r.timestamp, r.key, r.value, r.headers) for r in rs]


async def test_create_stream_and_look_it_up_by_name(storage: StreamStorage) -> None:
    stream = await storage.create_stream("orders-0")
    assert await storage.stream_id("orders-0") == stream
    assert await storage.create_stream("orders-1") != stream


async def test_stream_names_are_unique(storage: StreamStorage) -> None:
    await storage.create_stream("dup")
    with pytest.raises(ConflictError):
        await storage.create_stream("dup")


async def test_unknown_stream_name_is_not_found(storage: StreamStorage) -> None:
    with pytest.raises(NotFoundError):
        await storage.stream_id("nope")


@pytest.mark.parametrize("compression", list(Compression))
async def test_appended_records_read_back_exactly(
    storage: StreamStorage, compression: Compression
) -> None:
    stream = await storage.create_stream("s")
    written = records(50)
    first = await storage.append(stream, written[:20], compression=compression)
    second = await storage.append(stream, written[20:], compression=compression)
    assert (first, second) == (0, 20)
    read = await storage.read_records(stream, 0)
    assert [r.offset for r in read] == list(range(50))
    assert comparable(read) == comparable(written)


async def test_read_from_the_middle_of_a_batch_starts_at_the_offset(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    await storage.append(stream, records(10))
    read = await storage.read_records(stream, 7)
    assert [r.offset for r in read] == [7, 8, 9]


async def test_log_end_and_start(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    assert (await storage.log_start(stream), await storage.log_end(stream)) == (0, 0)
    await storage.append(stream, records(5))
    await storage.append(stream, records(3))
    assert (await storage.log_start(stream), await storage.log_end(stream)) == (0, 8)


async def test_the_log_start_of_an_empty_stream_stays_0_when_its_first_records_land_meanwhile(
    storage: StreamStorage, other_storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListOffsets EARLIEST of a partition nobody wrote yet, answered while another broker
    appends its first batch: the log start is 0 either way. Reading the log end after finding
    no entry answered the end of that batch, and a consumer starting from "earliest" skipped
    the batch for good."""
    stream = await storage.create_stream("s")
    store_ceiling = storage.metadata.ceiling
    found_nothing = asyncio.Event()
    appended = asyncio.Event()

    async def first_entry_then_append(key: str) -> Any:
        record = await store_ceiling(key)
        if not found_nothing.is_set():
            found_nothing.set()
            await appended.wait()  # the first batch lands right after the look-up
        return record

    monkeypatch.setattr(storage.metadata, "ceiling", first_entry_then_append)
    reading = asyncio.create_task(storage.log_start(stream))
    await found_nothing.wait()
    await other_storage.append(stream, records(9))
    appended.set()
    assert await reading == 0
    assert await storage.log_start(stream) == 0


async def test_read_at_log_end_is_empty_and_beyond_it_is_out_of_range(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    await storage.append(stream, records(4))
    at_end = await storage.read(stream, 4)
    assert (at_end.data, at_end.next_offset) == (b"", 4)
    with pytest.raises(OffsetOutOfRange) as exc:
        await storage.read(stream, 5)
    assert (exc.value.log_start, exc.value.log_end) == (0, 4)


async def test_read_respects_max_bytes_but_returns_at_least_one_batch(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    for _ in range(4):
        await storage.append(stream, records(10))
    batch_size = len(build_batch(records(10)))
    small = await storage.read(stream, 0, max_bytes=1)
    assert len(small.data) == batch_size
    assert small.next_offset == 10
    two = await storage.read(stream, 0, max_bytes=2 * batch_size)
    assert two.next_offset == 20
    everything = await storage.read(stream, 0, max_bytes=1 << 20)
    assert everything.next_offset == 40


async def test_a_read_says_whether_its_limit_held_back_records(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    for _ in range(2):
        await storage.append(stream, records(10))

    assert (await storage.read(stream, 0, max_bytes=1)).truncated is True
    assert (await storage.read(stream, 0, max_bytes=1 << 20)).truncated is False
    assert (await storage.read(stream, 20)).truncated is False  # at the log end


async def test_raw_batches_keep_their_bytes_except_the_base_offset(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    await storage.append(stream, records(3))
    raw = build_batch(records(2), compression=Compression.GZIP)
    assert await storage.append_batches(stream, raw) == 3
    read = await storage.read(stream, 3)
    assert read.data[8:] == raw[8:]
    assert int.from_bytes(read.data[:8], "big") == 3


async def test_invalid_batch_is_rejected_with_its_kafka_error_and_stores_nothing(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    corrupt = bytearray(build_batch(records(2)))
    corrupt[-1] ^= 0xFF
    with pytest.raises(BatchError) as exc:
        await storage.append_batches(stream, bytes(corrupt))
    assert exc.value.error_code == ErrorCode.corrupt_message
    assert await storage.log_end(stream) == 0


async def test_offset_for_timestamp_is_the_earliest_at_or_after_it(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    await storage.append(stream, records(10, start_ts=1000))  # timestamps 1000..1009
    await storage.append(stream, records(10, start_ts=2000))  # 2000..2009
    assert await storage.offset_for_timestamp(stream, 0) == 0
    assert await storage.offset_for_timestamp(stream, 1005) == 5
    assert await storage.offset_for_timestamp(stream, 1500) == 10
    assert await storage.offset_for_timestamp(stream, 2009) == 19
    assert await storage.offset_for_timestamp(stream, 2010) is None


async def test_long_poll_wakes_on_an_append_from_another_engine(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    waiting = asyncio.create_task(storage.wait_for_data([(stream, 0)], max_wait=30))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    await other_storage.append(stream, records(1))
    assert await asyncio.wait_for(waiting, 10) is True


async def test_long_poll_times_out_without_data(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    assert await storage.wait_for_data([(stream, 0)], max_wait=0.05) is False


def object_wal_config(data_dir: Path) -> Config:
    """The embedded default with WAL objects in the object store, a WAL not on local files."""
    overrides = {"data_dir": str(data_dir), "storage": {"flush_interval_ms": 2}}
    return load_config(env={}, overrides=overrides | {"wal": {"backend": "object"}})


@pytest.fixture
async def object_wal_storage(tmp_path: Path) -> AsyncIterator[StreamStorage]:
    async with await StreamStorage.open(object_wal_config(tmp_path)) as opened:
        yield opened


async def test_recent_wal_objects_of_a_remote_wal_are_served_from_memory(
    object_wal_storage: StreamStorage, tmp_path: Path
) -> None:
    storage = object_wal_storage
    assert not storage.wal.reads_from_page_cache
    stream = await storage.create_stream("s")
    await storage.append(stream, records(5))
    reads = count_wal_reads(storage.wal)
    await storage.read(stream, 0)
    assert reads == []
    async with await StreamStorage.open(object_wal_config(tmp_path)) as other_storage:
        other_reads = count_wal_reads(other_storage.wal)
        assert comparable(await other_storage.read_records(stream, 0)) == comparable(records(5))
        assert len(other_reads) == 1


async def test_recent_objects_of_the_local_wal_are_read_from_its_files(
    storage: StreamStorage,
) -> None:
    """The kernel's page cache holds them: a copy in memory would only cost a join."""
    assert storage.wal.reads_from_page_cache
    stream = await storage.create_stream("s")
    await storage.append(stream, records(5))
    reads = count_wal_reads(storage.wal)
    assert comparable(await storage.read_records(stream, 0)) == comparable(records(5))
    assert len(reads) == 1


async def test_a_read_across_entries_reads_their_wal_objects_at_once(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    # Each entry's chunk is in another object: on a remote store, reading them one after
    # another would cost a round trip each.
    stream = await other_storage.create_stream("s")
    for i in range(6):
        await other_storage.append(stream, records(4, tag=f"p{i}"))
    read_from_wal = storage.wal.read
    in_flight = most = 0

    async def slow_read(ref: str, start: int = 0, end: int | None = None) -> bytes | memoryview:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.01)
            return await read_from_wal(ref, start, end)
        finally:
            in_flight -= 1

    storage.wal.read = slow_read  # type: ignore[method-assign]
    result = await storage.read(stream, 0, max_bytes=1 << 20)

    assert most == 6
    assert result.next_offset == 24
    assert not result.truncated
    read = await storage.read_records(stream, 0)
    assert [r.offset for r in read] == list(range(24))
    assert comparable(read) == [c for i in range(6) for c in comparable(records(4, tag=f"p{i}"))]


async def four_streams_in_one_wal_object(writer: StreamStorage) -> list[int]:
    """Four streams of three records each, their chunks flushed together in one WAL object."""
    streams = [await writer.create_stream(f"s{i}") for i in range(4)]
    await asyncio.gather(
        *[
            await writer.submit_batches(s, build_batch(records(3, tag=f"t{i}")))
            for i, s in enumerate(streams)
        ]
    )
    return streams


async def test_streams_read_together_share_one_read_of_their_wal_object(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    # Four streams' chunks flushed in one WAL object: four readers at once (the partitions of
    # one fetch) cost one ranged read of the object, not four.
    streams = await four_streams_in_one_wal_object(other_storage)
    entries = [e for s in streams for e in await storage.index.scan(s)]
    assert len({e.location.ref for e in entries}) == 1  # type: ignore[union-attr]
    for s in streams:  # the index entries, as a broker holds them once it has read a stream
        await storage.read(s, 0)
    reads = count_wal_reads(storage.wal)

    read = await asyncio.gather(*(storage.read_records(s, 0) for s in streams))

    assert len(reads) == 1
    assert [comparable(r) for r in read] == [comparable(records(3, tag=f"t{i}")) for i in range(4)]


async def test_a_read_does_not_hold_the_parts_of_a_shared_read_it_did_not_ask_for(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    # Four streams read together share one ranged read of their WAL object. A fetch response
    # holding a view of that buffer would hold all four streams' bytes while the broker's
    # memory budget counts one: each read gets a copy of its own part instead.
    streams = await four_streams_in_one_wal_object(other_storage)
    for s in streams:
        await storage.read(s, 0)  # index entries cached, so the four reads start in one turn

    results = await asyncio.gather(*(storage.read(s, 0) for s in streams))

    for result in results:
        data = result.data
        if isinstance(data, memoryview) and data.obj is not None:
            assert 2 * data.nbytes >= memoryview(data.obj).nbytes
        assert read_header(data, 0).base_offset == 0
        assert result.next_offset == 3


async def test_readers_of_the_same_chunks_at_once_each_get_them_with_their_offsets(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    # Reads of one WAL range at the same moment share one buffer, and a buffer the store
    # filled for the read is patched where it is: both readers must still see right offsets.
    stream = await other_storage.create_stream("s")
    for i in range(3):
        await other_storage.append(stream, records(4, tag=f"p{i}"))
    await storage.read(stream, 0)  # index entries cached, so both reads start in one turn
    expected = [c for i in range(3) for c in comparable(records(4, tag=f"p{i}"))]

    for offset in (0, 4, 5):
        reads = await asyncio.gather(*(storage.read_records(stream, offset) for _ in range(3)))
        for read in reads:
            assert [r.offset for r in read] == list(range(offset, 12))
            assert comparable(read) == expected[offset:]


async def test_reading_this_process_recent_wal_objects_leaves_them_as_written(
    object_wal_storage: StreamStorage,
) -> None:
    # Tail reads are answered from the WAL objects this process wrote, kept in memory: their
    # bytes must be copied to be patched, never patched in place for the next reader.
    storage = object_wal_storage
    first = await storage.create_stream("a")
    second = await storage.create_stream("b")
    await storage.append(first, records(3, tag="a"))
    await storage.append(second, records(5, tag="b"))
    await storage.append(first, records(2, tag="c"))
    recent = storage._reader._recent  # type: ignore[attr-defined]
    held = {ref: bytes(data) for ref, data in recent._objects.items()}  # type: ignore[attr-defined]
    assert held

    for _ in range(2):
        read = await storage.read_records(first, 0)
        assert [r.offset for r in read] == list(range(5))
        assert [r.offset for r in await storage.read_records(second, 1)] == list(range(1, 5))

    assert {ref: bytes(data) for ref, data in recent._objects.items()} == held  # type: ignore[attr-defined]


async def test_a_read_stops_at_its_limit_even_when_entries_are_read_at_once(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    for i in range(6):
        await storage.append(stream, records(4, tag=f"p{i}"))
    one_entry = len((await storage.read(stream, 0, max_bytes=1)).data)

    result = await storage.read(stream, 4, max_bytes=2 * one_entry)

    assert result.next_offset == 12
    assert result.truncated
    assert len(result.data) == 2 * one_entry


async def test_a_long_index_walk_lets_other_tasks_run_within_a_page(
    storage: StreamStorage,
) -> None:
    # The compactor walks every stream's backlog: decoding a whole page of entries in one
    # turn of the event loop held every client's requests for tens of milliseconds.
    stream = await storage.create_stream("s")
    for i in range(3 * index_reader.ENTRIES_PER_TURN):
        await storage.append(stream, records(1, tag=f"p{i}"))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    seen = []
    try:
        async for _ in storage.index.entries(stream):  # one page: no store query in between
            seen.append(ticks)
    finally:
        ticker.cancel()

    per_turn = index_reader.ENTRIES_PER_TURN
    assert len(seen) == 3 * per_turn
    assert seen[0] == seen[per_turn - 1] < seen[per_turn] == seen[2 * per_turn - 1] < seen[-1]


async def test_index_entries_are_read_page_by_page_in_order(
    storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_reader, "SCAN_PAGE", 3)
    stream = await storage.create_stream("s")
    for i in range(10):
        await storage.append(stream, records(2, tag=f"p{i}"))
    ends = [e.end async for e in storage.index.entries(stream)]
    assert ends == list(range(2, 21, 2))
    assert [e.end for e in await storage.index.scan(stream, after_end=13)] == [14, 16, 18, 20]


async def test_a_wal_on_the_local_store_flushes_for_latency(storage: StreamStorage) -> None:
    # An append to a local disk costs nothing: no reason to hold produces back for 200 ms.
    assert storage.flush_profile is FlushProfile.LATENCY


def test_a_wal_billed_per_append_flushes_for_cost_unless_told_otherwise() -> None:
    assert StorageOptions().flush_profile(billed_per_append=True) is FlushProfile.COST
    assert StorageOptions().flush_profile(billed_per_append=False) is FlushProfile.LATENCY
    chosen = StorageOptions(profile=FlushProfile.COST)
    assert chosen.flush_profile(billed_per_append=False) is FlushProfile.COST


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 10) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "it never happened"
        await asyncio.sleep(0.02)


async def test_log_bound_hints_follow_commits_anywhere(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    assert storage.index.log_end_hint(stream) is None
    await storage.append(stream, records(3))
    assert storage.index.log_end_hint(stream) == 3  # its own commit, at once

    await other_storage.append(stream, records(2))  # another broker's, by notification

    async def end_seen() -> bool:
        return storage.index.log_end_hint(stream) == 5

    await eventually(end_seen)


async def test_the_log_start_hint_follows_retention_anywhere(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    for _ in range(2):
        await storage.append(stream, records(3))
    assert await storage.index.log_start_hint(stream) == 0

    first = await other_storage.index.first_entry(stream)
    assert first is not None
    assert await other_storage.offset_index.expire(stream, [first]) == 1

    async def start_seen() -> bool:
        return await storage.index.log_start_hint(stream) == 3

    await eventually(start_seen)


async def test_a_swap_deletes_what_it_replaces_last_first_a_transaction_per_chunk(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    for _ in range(150):
        await storage.append(stream, records(1))
    entries = [entry async for entry in storage.offset_index.entries(stream)]
    replaced = [keys.index_key(stream, e.end, e.cumulative_size) for e in entries]
    assert len(replaced) == 150
    piece = NewPiece(ParquetLocation("tables/s/data.parquet", 1, ((0, 149),)), 0, 150, 0, 0)
    transactions, deletes = _metadata_ops("transact"), _metadata_ops("delete")

    async with await storage.metadata.watch(keys.index_sequence(stream)) as watch:
        assert await storage.offset_index.swap(replaced, [piece])
        deleted: list[str] = []
        while len(deleted) < len(replaced) - 1:
            event = await asyncio.wait_for(watch.next_event(), 10)
            assert event is not None
            if event.kind is EventKind.DELETE and event.key is not None:
                deleted.append(event.key)

    assert deleted == replaced[-2::-1]  # the last entry first: no look-up meets a gap
    assert _metadata_ops("transact") - transactions == 3  # 149 deletes, 64 a transaction
    assert _metadata_ops("delete") == deletes
    (swapped,) = [entry async for entry in storage.offset_index.entries(stream)]
    assert (swapped.start, swapped.end, swapped.location) == (0, 150, piece.location)


async def test_a_swapped_entry_keeps_the_newest_write_time_and_each_producers_last_batches(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    sequences = {7: 0, 8: 0}
    for producer in [7, 8, 7, 7, 7, 7, 8, 7, 7]:  # one entry each, two records a batch
        sent = build_batch(
            records(2), producer_id=producer, producer_epoch=0, base_sequence=sequences[producer]
        )
        await storage.append_batches(stream, sent)
        sequences[producer] += 2
    entries = [entry async for entry in storage.offset_index.entries(stream)]
    assert len(entries) == 9
    replaced = [keys.index_key(stream, e.end, e.cumulative_size) for e in entries]
    piece = NewPiece(ParquetLocation("tables/s/data.parquet", 1, ((0, 17),)), 0, 18, 0, 0)

    assert await storage.offset_index.swap(replaced, [piece])

    (swapped,) = [entry async for entry in storage.offset_index.entries(stream)]
    assert swapped.created_ms == max(e.created_ms for e in entries)
    kept = [(p.producer_id, p.first_sequence, p.offset_delta) for p in swapped.producers]
    # Producer 7's last five batches (of seven) and both of 8's, at their offsets in the piece.
    assert kept == [
        (7, 4, 6),
        (7, 6, 8),
        (7, 8, 10),
        (7, 10, 14),
        (7, 12, 16),
        (8, 0, 2),
        (8, 2, 12),
    ]


async def test_the_entry_an_append_keeps_in_memory_is_the_one_the_store_holds(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    await storage.append(stream, records(3))
    await storage.append(stream, records(2, tag="later"))
    kept = [entry async for entry in storage.offset_index.entries(stream)]
    prefix = keys.index_sequence(stream)
    stored = await storage.metadata.scan(prefix, prefix + "\xff")
    assert kept == [index.decode(r.key, r.value) for r in stored]
    assert [(e.start, e.end) for e in kept] == [(0, 3), (3, 5)]


def _metadata_ops(op: str) -> float:
    return REGISTRY.get_sample_value("icefloe_metadata_op_seconds_count", {"op": op}) or 0.0


async def test_an_entry_stays_cached_after_the_notice_of_its_own_append(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream, barrier = await storage.create_stream("s"), await storage.create_stream("barrier")
    await storage.append(stream, records(3))
    # Notices arrive in order: once the other engine's append is seen, so is our own.
    await other_storage.append(barrier, records(1))

    async def barrier_seen() -> bool:
        return storage.index.log_end_hint(barrier) == 1

    await eventually(barrier_seen)
    looked_up: list[str] = []
    real_scan = storage.metadata.scan

    async def counting_scan(start: str, end: str, *, limit: int | None = None) -> object:
        looked_up.append(start)
        return await real_scan(start, end, limit=limit)

    storage.metadata.scan = counting_scan  # type: ignore[method-assign, assignment]
    assert len(await storage.read_records(stream, 0)) == 3
    # The entry came from the cache; only the log end is asked of the store (absence is
    # never trusted to a cache).
    assert looked_up == [keys.index_search_key(stream, 3 + 1)]


async def test_a_reader_catching_up_reads_many_index_entries_per_store_query(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    """Another engine, whose cache holds none of the entries, reads 200 of them: they come
    a page of entries per query, not one query each."""
    stream = await storage.create_stream("s")
    for n in range(200):
        await storage.append(stream, records(1, tag=f"r{n}-"))
    queried: list[str] = []
    metadata = other_storage.metadata
    real_scan, real_ceiling = metadata.scan, metadata.ceiling

    async def counting_scan(start: str, end: str, *, limit: int | None = None) -> object:
        queried.append(start)
        return await real_scan(start, end, limit=limit)

    async def counting_ceiling(key: str) -> object:
        queried.append(key)
        return await real_ceiling(key)

    metadata.scan = counting_scan  # type: ignore[method-assign, assignment]
    metadata.ceiling = counting_ceiling  # type: ignore[method-assign, assignment]
    read: list[Record] = []
    while len(read) < 200:
        read += await other_storage.read_records(stream, len(read))

    assert [r.offset for r in read] == list(range(200))
    index_queries = [key for key in queried if key.startswith(keys.index_sequence(stream))]
    assert len(index_queries) <= 200 // index_reader.READ_AHEAD_ENTRIES + 2


@pytest.mark.parametrize("target", list(Compression))
async def test_a_topic_codec_recompresses_batches_of_another(
    storage: StreamStorage, target: Compression
) -> None:
    stream = await storage.create_stream("s")
    records = [
        Record(i, 1_700_000_000_000 + i, b"k", b"value %d" % i, (("h", b"x"),)) for i in range(5)
    ]
    sent = build_batch(
        records, compression=Compression.GZIP, producer_id=7, producer_epoch=1, base_sequence=0
    )
    await (await storage.submit_batches(stream, sent, compression=target))

    stored = (await storage.read(stream, 0)).data
    header = read_header(stored)
    assert header.compression is target
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 1, 0)
    assert await storage.read_records(stream, 0) == records


async def test_records_that_do_not_decompress_are_corrupt_message(storage: StreamStorage) -> None:
    stream = await storage.create_stream("s")
    sent = bytearray(build_batch([Record(0, 0, None, b"v" * 100)], compression=Compression.ZSTD))
    sent[-8:] = b"\xff" * 8  # inside the compressed records; the CRC is made to match again
    struct.pack_into(">I", sent, CRC_AT, crc32c(memoryview(sent)[ATTRIBUTES_AT:]))
    with pytest.raises(BatchError) as caught:
        await storage.submit_batches(stream, bytes(sent), compression=Compression.LZ4)
    assert caught.value.error_code == ErrorCode.corrupt_message
    await storage.submit_batches(stream, bytes(sent))  # stored as sent: nothing decompresses it


async def test_records_whose_offsets_are_not_consecutive_are_invalid_record_to_recompress(
    storage: StreamStorage,
) -> None:
    """Kafka refuses such records in any batch it decodes; uncompressed ones it stores as sent."""
    stream = await storage.create_stream("s")
    sent = batch_with_deltas([(0, 1), (0, 1)])
    with pytest.raises(BatchError) as caught:
        await storage.submit_batches(stream, sent, compression=Compression.LZ4)
    assert caught.value.error_code == ErrorCode.invalid_record
    await (await storage.submit_batches(stream, sent))


async def test_a_batch_that_grows_past_the_limit_when_recompressed_is_too_large(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    records = [Record(i, 0, None, b"a" * 1000) for i in range(20)]
    sent = build_batch(records, compression=Compression.ZSTD)  # 20 kB of "a": tiny compressed
    with pytest.raises(BatchError) as caught:
        await storage.submit_batches(
            stream, sent, max_batch_bytes=10_000, compression=Compression.NONE
        )
    assert caught.value.error_code == ErrorCode.message_too_large
    assert "once stored with the topic's compression.type (none)" in str(caught.value)
    await (await storage.submit_batches(stream, sent, max_batch_bytes=10_000))  # as sent: fits


async def _held_wal_appends(
    tmp_path: Path, later_batches: int
) -> tuple[list[int], list[int], list[Record], int]:
    """One flush slot and 1 KiB flushes; the first WAL append is held while ``later_batches``
    more batches arrive. Returns the WAL object sizes at the release and in the end, the
    records read back, and the index entries of the stream."""
    config = storage_config(
        tmp_path, flush_bytes=1024, max_inflight_flushes=1, flush_interval_ms=10_000
    )
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("s")
        wal = _HeldWal(storage)
        wal.release.clear()
        first = await storage.submit_batches(stream, build_batch(records(20)))
        later = [
            await storage.submit_batches(stream, build_batch(records(20, tag=f"b{i}")))
            for i in range(later_batches)
        ]
        await asyncio.sleep(0.05)
        at_release = list(wal.sizes)
        wal.release.set()
        await asyncio.gather(first, *later)
        read = await storage.read_records(stream, 0, max_bytes=1 << 20)
        return at_release, wal.sizes, read, len(await storage.index.scan(stream))


async def test_appends_made_while_every_flush_is_busy_share_the_next_wal_object(
    tmp_path: Path,
) -> None:
    at_release, sizes, read, entries = await _held_wal_appends(tmp_path, later_batches=4)

    assert len(at_release) == 1  # nothing sealed behind the busy flush
    assert len(sizes) == 2  # the four later batches in one object
    assert entries == 2
    expected = records(20) + [r for i in range(4) for r in records(20, tag=f"b{i}")]
    assert [r.offset for r in read] == list(range(100))
    assert comparable(read) == comparable(expected)


async def test_a_busy_writer_still_seals_objects_of_bounded_size(tmp_path: Path) -> None:
    batch = len(build_batch(records(20)))
    _, sizes, read, _ = await _held_wal_appends(tmp_path, later_batches=16)

    assert len(sizes) > 2
    assert max(sizes[1:]) <= 8 * 1024 + 2 * batch  # the cap, plus WAL framing
    assert [r.offset for r in read] == list(range(340))


class _HeldWal:
    """Records the size of every WAL append and holds each until released."""

    def __init__(self, storage: StreamStorage) -> None:
        self.sizes: list[int] = []
        self.release = asyncio.Event()
        self.release.set()
        self._append = storage.wal._append_parts  # type: ignore[attr-defined]
        storage.wal._append_parts = self._held  # type: ignore[method-assign]

    async def _held(self, parts: list[memoryview]) -> str:
        self.sizes.append(sum(len(part) for part in parts))
        await self.release.wait()
        return await self._append(parts)


async def test_an_idle_writer_seals_at_once_and_the_partitions_sent_together_share_an_object(
    tmp_path: Path,
) -> None:
    config = storage_config(tmp_path, flush_interval_ms=60_000)  # the timer never fires here
    async with await StreamStorage.open(config) as storage:
        assert storage.flush_profile is FlushProfile.LATENCY
        streams = [await storage.create_stream(f"p{i}") for i in range(3)]
        wal = _HeldWal(storage)
        pending = [await storage.submit_batches(s, build_batch(records(5))) for s in streams]

        offsets = await asyncio.wait_for(asyncio.gather(*pending), timeout=10)

        assert offsets == [0, 0, 0]
        assert len(wal.sizes) == 1  # one object for the three, sealed without the interval


async def test_appends_made_during_the_only_flush_are_sealed_as_soon_as_it_ends(
    tmp_path: Path,
) -> None:
    config = storage_config(tmp_path, flush_interval_ms=60_000)
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("s")
        wal = _HeldWal(storage)
        wal.release.clear()
        try:
            first = await storage.submit_batches(stream, build_batch(records(5)))
            await asyncio.sleep(0.05)
            later = [
                await storage.submit_batches(stream, build_batch(records(5, tag=f"b{i}")))
                for i in range(3)
            ]
            await asyncio.sleep(0.05)
            assert len(wal.sizes) == 1  # the later ones wait while the flush is under way
        finally:
            wal.release.set()  # a failed check must not leave the close waiting on the WAL

        offsets = await asyncio.wait_for(asyncio.gather(first, *later), timeout=10)

        assert offsets == [0, 5, 10, 15]
        assert len(wal.sizes) == 2  # all three in the next object


@pytest.mark.parametrize(
    ("settings", "profile"),
    [
        ({"seal_when_idle": False}, FlushProfile.LATENCY),
        ({"profile": "cost", "flush_quiet_ms": 0}, FlushProfile.COST),
    ],
)
async def test_a_writer_that_does_not_seal_when_idle_waits_for_the_interval(
    tmp_path: Path, settings: dict[str, Any], profile: FlushProfile
) -> None:
    config = storage_config(tmp_path, flush_interval_ms=60_000, **settings)
    async with await StreamStorage.open(config) as storage:
        assert storage.flush_profile is profile
        stream = await storage.create_stream("s")
        wal = _HeldWal(storage)
        pending = await storage.submit_batches(stream, build_batch(records(5)))
        await asyncio.sleep(0.1)

        assert wal.sizes == []
        assert not pending.done()
        await storage.flush()
        assert await pending == 0


async def test_the_cost_profile_seals_once_its_producers_fall_quiet(tmp_path: Path) -> None:
    config = storage_config(tmp_path, profile="cost", flush_interval_ms=60_000)
    async with await StreamStorage.open(config) as storage:
        streams = [await storage.create_stream(f"p{i}") for i in range(3)]
        wal = _HeldWal(storage)
        pending = [await storage.submit_batches(s, build_batch(records(5))) for s in streams]

        # the default quiet period (10 ms), not the interval (60 s), seals them
        offsets = await asyncio.wait_for(asyncio.gather(*pending), timeout=10)

        assert offsets == [0, 0, 0]
        assert len(wal.sizes) == 1


async def test_a_steady_stream_of_appends_is_not_sealed_by_the_quiet_period(
    tmp_path: Path,
) -> None:
    config = storage_config(
        tmp_path, profile="cost", flush_interval_ms=60_000, flush_quiet_ms=1_000
    )
    async with await StreamStorage.open(config) as storage:
        stream = await storage.create_stream("s")
        wal = _HeldWal(storage)
        pending = []
        for i in range(6):  # an append every 50 ms: never a quiet second
            pending.append(
                await storage.submit_batches(stream, build_batch(records(5, tag=f"{i}")))
            )
            await asyncio.sleep(0.05)
        assert wal.sizes == []

        offsets = await asyncio.wait_for(asyncio.gather(*pending), timeout=10)

        assert offsets == [0, 5, 10, 15, 20, 25]
        assert len(wal.sizes) == 1  # sealed a second after the last append, all in one object


async def test_flushes_large_and_small_are_encoded_on_the_event_loop_and_read_back_exactly(
    storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    encoded_in: list[threading.Thread] = []
    encode = walformat.encode_wal_object

    def recording(*args: Any, **kwargs: Any) -> walformat.EncodedWalObject:
        encoded_in.append(threading.current_thread())
        return encode(*args, **kwargs)

    monkeypatch.setattr(walformat, "encode_wal_object", recording)
    streams = [await storage.create_stream("big-a"), await storage.create_stream("big-b")]
    written = [
        [Record(i, 1_700_000_000_000 + i, None, bytes([i]) * 20_000, ()) for i in range(10)]
        for _ in streams
    ]
    await asyncio.gather(*(storage.append(s, w) for s, w in zip(streams, written, strict=True)))
    small = await storage.append(streams[0], records(1))

    # The join holds the GIL in any thread: a hop to a worker would only add latency.
    assert len(encoded_in) >= 2  # the 400 kB flush, then the small one
    assert all(thread is threading.main_thread() for thread in encoded_in)
    assert small == 10
    for stream, expected in zip(streams, written, strict=True):
        read = await storage.read_records(stream, 0, max_bytes=1 << 20)
        assert comparable(read[:10]) == comparable(expected)
