"""A stored object that the offset index references but that is missing or corrupt: reads of
its records fail with a clear, typed error naming the object and the stream, and everything
else in the stream stays readable. (A WAL object that compaction replaced and collected is not
lost: the reader finds the Parquet entry that replaced it.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import Config
from icefloe.embedded import local_wal
from icefloe.errors import CorruptDataError, LostDataError
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
from icefloe.storage.row_schema import ROW_SCHEMA
from icefloe.topics.registry import TopicRegistry
from tests.compaction.test_compaction import comparable, read_all, records


def parquet_file(config: Config, entry: IndexEntry) -> Path:
    """Where the local object store keeps the data file an entry points to."""
    location = entry.location
    assert isinstance(location, ParquetLocation)
    return Path(config.data_dir) / "objects" / location.key


def wal_chunk_in_segment(config: Config, entry: IndexEntry) -> tuple[Path, int]:
    """The local WAL's segment file holding an entry's chunk, and where the chunk starts."""
    location = entry.location
    assert isinstance(location, WalLocation)
    segment, record, _ = location.ref.split(":")
    path = Path(config.data_dir) / "wal" / f"{segment}{local_wal.SUFFIX}"
    return path, int(record) + local_wal.HEADER_BYTES + location.position


async def lose(storage: StreamStorage, entry: IndexEntry) -> None:
    """Delete the WAL object an entry points to, as garbage collection does."""
    assert isinstance(entry.location, WalLocation)
    await storage.wal.delete(entry.location.ref)


async def three_entries(config: Config, storage: StreamStorage) -> tuple[int, list[IndexEntry]]:
    """A stream of three entries of 10 records, written by another engine (nothing cached)."""
    async with await StreamStorage.open(config) as writer:
        stream = await writer.create_stream("s")
        for tag in ("a", "b", "c"):
            await writer.append(stream, records(10, tag))
    return stream, await storage.index.scan(stream)


async def test_a_missing_wal_object_is_lost_data_naming_the_object_and_the_stream(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage, _, _ = parts
    stream, entries = await three_entries(config, storage)
    await lose(storage, entries[1])

    with pytest.raises(LostDataError) as lost:
        await storage.read(stream, 10)

    message = str(lost.value)
    assert f"stream {stream}" in message
    assert "offsets [10, 20)" in message
    assert entries[1].location.ref in message  # type: ignore[union-attr]
    assert [r.offset for r in await storage.read_records(stream, 20)] == list(range(20, 30))
    assert [r.offset for r in await storage.read_records(stream, 0, max_bytes=1)] == list(range(10))


async def test_a_corrupt_wal_object_is_corrupt_data(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage, _, _ = parts
    stream, entries = await three_entries(config, storage)
    path, chunk = wal_chunk_in_segment(config, entries[0])
    data = bytearray(path.read_bytes())
    location = entries[0].location
    assert isinstance(location, WalLocation)
    data[chunk + location.length - 1] ^= 0xFF  # the last record byte of the chunk
    path.write_bytes(bytes(data))

    with pytest.raises(CorruptDataError, match="CRC"):
        await storage.read(stream, 0)
    assert (await storage.read_records(stream, 10))[0].offset == 10


async def one_compacted_entry(
    parts: tuple[StreamStorage, TopicRegistry, Compactor],
) -> tuple[int, IndexEntry]:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, records(10, "a"))
    await compactor.until_idle()
    (entry,) = await storage.index.scan(stream)
    return stream, entry


async def test_a_missing_parquet_file_is_lost_data(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage = parts[0]
    stream, entry = await one_compacted_entry(parts)
    parquet_file(config, entry).unlink()

    with pytest.raises(LostDataError, match=r"Parquet file .* missing"):
        await storage.read(stream, 0)
    with pytest.raises(LostDataError):
        await storage.offset_for_timestamp(stream, 0)


async def test_a_corrupt_parquet_file_is_corrupt_data(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage = parts[0]
    stream, entry = await one_compacted_entry(parts)
    path = parquet_file(config, entry)
    path.write_bytes(bytes(path.stat().st_size))  # same size, all zeros

    with pytest.raises(CorruptDataError, match="Parquet file"):
        await storage.read(stream, 0)


async def test_a_parquet_file_without_the_row_groups_its_entry_names_is_corrupt_data(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage = parts[0]
    stream, entry = await one_compacted_entry(parts)
    path = parquet_file(config, entry)
    empty = pa.BufferOutputStream()
    pq.ParquetWriter(empty, ROW_SCHEMA, store_schema=False).close()  # a file of no row groups
    tail = empty.getvalue().to_pybytes()
    path.write_bytes(bytes(path.stat().st_size - len(tail)) + tail)  # same size

    with pytest.raises(CorruptDataError, match="row group 0"):
        await storage.read(stream, 0)
    with pytest.raises(CorruptDataError, match="row group 0"):
        await storage.offset_for_timestamp(stream, 0)


async def test_a_wal_object_replaced_by_compaction_is_not_lost(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    await storage.append(stream, records(10, "a"))
    before = await read_all(storage, stream)  # caches the WAL entry
    (wal_entry,) = await storage.index.scan(stream)
    await compactor.until_idle()
    await lose(storage, wal_entry)  # as garbage collection would, after the swap
    storage.index.remember(wal_entry, 0)  # a stale cache, as before a notification arrives

    assert comparable(await read_all(storage, stream)) == comparable(before)


async def test_wal_objects_replaced_by_compaction_in_the_middle_of_a_read_are_not_lost(
    config: Config, parts: tuple[StreamStorage, TopicRegistry, Compactor]
) -> None:
    # The chunks of several stale entries are read at once; the first one found gone sends
    # the read to the Parquet entry that replaced them all, and the other reads are dropped.
    storage, topics, compactor = parts
    stream = (await topics.create("t", 1)).streams[0]
    for tag in ("a", "b", "c", "d"):
        await storage.append(stream, records(10, tag))
    before = await read_all(storage, stream)
    wal_entries = await storage.index.scan(stream)
    await compactor.until_idle()
    for entry in wal_entries[1:]:
        await lose(storage, entry)
        storage.index.remember(entry, 0)

    result = await storage.read(stream, 10, max_bytes=1 << 20)

    assert result.next_offset == 40
    assert comparable(await read_all(storage, stream)) == comparable(before)
