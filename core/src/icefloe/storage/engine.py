"""Stream storage as a library: the same engine the broker uses, with no broker in between.

Example::

    from icefloe.storage.engine import StreamStorage
    from icefloe.storage.records import Record

    async with await StreamStorage.open() as storage:     # the configuration icefloe uses
        stream = await storage.create_stream("clicks-0")
        first = await storage.append(stream, [Record(0, 1_700_000_000_000, b"k", b"v")])
        for record in await storage.read_records(stream, first):
            print(record.offset, record.key, record.value)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Self, TypeVar

import msgpack
from kio.schema.errors import ErrorCode

from icefloe import config as configuration
from icefloe.config.storage import FlushProfile, StorageOptions
from icefloe.errors import NotFoundError
from icefloe.ports.base import OpenContext, Port
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.storage import counters, keyed, keys
from icefloe.storage.batch import (
    BatchError,
    Compression,
    read_header,
    split_and_validate,
    with_log_append_time,
)
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.offset_index import OffsetIndex
from icefloe.storage.orphans import OrphanCollector
from icefloe.storage.producers import ProducerStates
from icefloe.storage.reader import OffsetOutOfRange, ReadResult, StreamReader
from icefloe.storage.recent import RecentWalObjects
from icefloe.storage.records import Record, build_batch, decode_batch, recompress
from icefloe.storage.transactions import TransactionMarks
from icefloe.storage.writer import ValidBatch, WalWriter

P = TypeVar("P", bound=Port)


class StreamStorage:
    """Append to and read from streams; see the module docstring for an example."""

    def __init__(
        self,
        metadata: MetadataStore,
        object_store: ObjectStore,
        wal: WAL,
        options: StorageOptions,
        *,
        owned: Sequence[Port] = (),
    ) -> None:
        self.metadata = metadata
        self.object_store = object_store
        self.wal = wal
        self.options = options
        self._owned = list(owned)
        # Half the grace period at most: a swap may come well after its objects were written.
        keep_replaced_s = min(options.replaced_wal_reads_s, options.orphan_grace_s / 2)
        self.index = IndexReader(metadata, options.index_cache_entries, keep_replaced_s)
        self.offset_index = OffsetIndex(metadata, self.index)
        """The only writer of index entries (the writer, compaction and retention use it)."""
        self._recent = RecentWalObjects(options.wal_cache_bytes)
        self.producers = ProducerStates(metadata, self.index, options.producer_lease_s)
        self.transactions = TransactionMarks(metadata)
        """Open and aborted transactions per stream (written by the transaction coordinator)."""
        self._writer = WalWriter(wal, self.offset_index, options, self._recent, self.producers)
        self._reader = StreamReader(
            wal, object_store, self.index, self._recent, options.rebuilt_cache_bytes
        )
        self._orphans = OrphanCollector(wal, metadata, options.orphan_grace_s)

    @classmethod
    async def open(
        cls,
        config: configuration.Config | None = None,
        *,
        config_path: str | os.PathLike[str] | None = None,
        watch_delay_s: float = 0.0,
    ) -> Self:
        """Open the metadata store, object store and WAL the configuration selects.

        Args:
            config: A loaded configuration; by default read as ``icefloe`` reads it
                (``ICEFLOE_CONFIG``, ``ICEFLOE_*`` environment variables, defaults).
            config_path: A TOML file to read instead of ``ICEFLOE_CONFIG``.
            watch_delay_s: How late this process may hear of other processes' changes
                (:class:`~icefloe.ports.base.OpenContext`).
        """
        config = config or configuration.load_config(config_path)
        opened: list[Port] = []
        try:
            context = OpenContext(data_dir=Path(config.data_dir), watch_delay_s=watch_delay_s)
            metadata = await _open(config, MetadataStore, context, opened)
            store = await _open(config, ObjectStore, context, opened)
            context = dataclasses.replace(context, object_store=store, config=config)
            wal = await _open(config, WAL, context, opened)
            storage = cls(metadata, store, wal, config.storage, owned=list(reversed(opened)))
            await storage.start()
            return storage
        except BaseException:
            for port in reversed(opened):
                with contextlib.suppress(Exception):
                    await port.close()
            raise

    @property
    def flush_profile(self) -> FlushProfile:
        """The WAL flush profile in force (``[storage] profile``, or the WAL's default)."""
        return self._writer.profile

    async def start(self) -> None:
        """Follow index notifications (cache invalidation, long polls) and open transactions."""
        await self.index.start()
        await self.transactions.start()

    async def close(self) -> None:
        """Commit what is buffered, stop background work, close the ports this opened."""
        await self._writer.close()
        await self._reader.close()
        await self.producers.close()
        await self.transactions.close()
        await self.index.close()
        for port in self._owned:
            await port.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # --- streams ----------------------------------------------------------------------------

    async def create_stream(self, name: str) -> int:
        """Create a stream named ``name`` and return its id.

        Raises:
            ConflictError: a stream with that name exists.
        """
        stream_id = await counters.increment(self.metadata, "stream-id")
        record = msgpack.packb({"name": name, "created_ms": int(time.time() * 1000)})
        await self.metadata.put(
            keys.stream_name(name), str(stream_id).encode(), expected_version=MUST_NOT_EXIST
        )
        await self.metadata.put(keys.stream_record(stream_id), record)
        return stream_id

    async def delete_stream(self, stream_id: int) -> None:
        """Delete a stream: its index, its producers' state and its records. Its WAL objects
        are then unreferenced and collected as orphans; its Parquet files stay in the tables.
        Deleting a stream that is gone does nothing."""
        record = await self.metadata.get(keys.stream_record(stream_id))
        await self.offset_index.drop(stream_id)
        await self.producers.drop(stream_id)
        await self.transactions.drop(stream_id)
        await self.metadata.delete(keys.stream_record(stream_id))
        if record is not None:
            name = msgpack.unpackb(record.value, raw=False)["name"]
            await self.metadata.delete(keys.stream_name(name))

    async def stream_id(self, name: str) -> int:
        """The id of the stream ``name``.

        Raises:
            NotFoundError: no such stream.
        """
        record = await self.metadata.get(keys.stream_name(name))
        if record is None:
            raise NotFoundError(f"no stream named {name!r}")
        return int(record.value)

    # --- writing ----------------------------------------------------------------------------

    async def append_batches(self, stream_id: int, data: bytes | memoryview) -> int:
        """Append Kafka v2 record batches exactly as received; return the first offset.

        Raises:
            BatchError: a batch is invalid; its ``error_code`` is the Kafka error to return.
        """
        return await (await self.submit_batches(stream_id, data))

    async def submit_batches(
        self,
        stream_id: int,
        data: bytes | memoryview,
        *,
        max_batch_bytes: int | None = None,
        compression: Compression | None = None,
        log_append_time_ms: int | None = None,
        keys_required_for: str | None = None,
    ) -> asyncio.Future[int]:
        """Validate and buffer batches; the future gives the first offset once committed.

        ``max_batch_bytes`` is the stream's batch limit (default: ``[storage]
        max_batch_bytes``). With ``compression``, batches that use another codec are stored
        recompressed with it; with ``log_append_time_ms``, stamped with that time
        (:func:`~icefloe.storage.batch.with_log_append_time`). With ``keys_required_for`` (the
        ``topic-N`` of a compacted topic's partition), a record without a key is refused
        (:mod:`icefloe.storage.keyed`). See :meth:`WalWriter.submit` for why the two steps are
        separate.

        Raises:
            BatchError: a batch is invalid (when recompressing: ``CORRUPT_MESSAGE`` for
                records that do not decompress, ``INVALID_RECORD`` for records whose offsets
                are not consecutive, as Kafka refuses them; ``INVALID_RECORD`` for a keyless
                record).
        """
        view = memoryview(data)
        limit = self.options.max_batch_bytes if max_batch_bytes is None else max_batch_bytes
        infos = split_and_validate(view, max_batch_bytes=limit)
        chunks: list[bytes | bytearray | memoryview] = [
            view[i.position : i.position + i.size] for i in infos
        ]
        if keys_required_for is not None:
            if any(i.compression is not Compression.NONE for i in infos):
                await asyncio.to_thread(keyed.check_keys, chunks, keys_required_for)
            else:
                keyed.check_keys(chunks, keys_required_for)
        if compression is not None and any(i.compression is not compression for i in infos):
            chunks = await asyncio.to_thread(_recompressed, chunks, compression)
            if too_large := [len(chunk) for chunk in chunks if len(chunk) > limit]:
                raise BatchError(
                    ErrorCode.message_too_large,
                    f"record batch is {too_large[0]} bytes once stored with the topic's "
                    f"compression.type ({compression.name.lower()}), over the limit of "
                    f"{limit} (max.message.bytes)",
                )
        if log_append_time_ms is not None:
            chunks = [with_log_append_time(chunk, log_append_time_ms) for chunk in chunks]
        valid = [
            ValidBatch(
                data=memoryview(chunk),
                record_count=info.record_count,
                producer_id=info.producer_id,
                producer_epoch=info.producer_epoch,
                base_sequence=info.base_sequence,
            )
            for chunk, info in zip(chunks, infos, strict=True)
        ]
        return await self._writer.submit(stream_id, valid)

    async def append_control(self, stream_id: int, data: bytes) -> int:
        """Append a control batch (a transaction marker, made by the broker, never taken from a
        client); return its offset once committed."""
        batch = ValidBatch(data=memoryview(data), record_count=1)
        return await (await self._writer.submit(stream_id, [batch]))

    async def append(
        self,
        stream_id: int,
        records: Sequence[Record],
        *,
        compression: Compression = Compression.NONE,
    ) -> int:
        """Append records as one batch; return the offset of the first.

        Record offsets are ignored (the stream assigns them); timestamps are kept.
        """
        if not records:
            raise ValueError("append needs at least one record")
        numbered = [r._replace(offset=i) for i, r in enumerate(records)]
        return await self.append_batches(stream_id, build_batch(numbered, compression=compression))

    async def flush(self) -> None:
        """Seal and commit everything buffered now."""
        await self._writer.flush()

    async def allocate_producer_id(self) -> int:
        return await self.producers.allocate_producer_id()

    # --- reading ----------------------------------------------------------------------------

    async def read(self, stream_id: int, offset: int, max_bytes: int = 1 << 20) -> ReadResult:
        """Record batches from ``offset``, base offsets patched; see :meth:`StreamReader.read`."""
        return await self._reader.read(stream_id, offset, max_bytes)

    async def read_records(
        self, stream_id: int, offset: int, max_bytes: int = 1 << 20
    ) -> list[Record]:
        """Decoded records from ``offset`` on (records before ``offset`` in the first batch are
        dropped)."""
        result = await self.read(stream_id, offset, max_bytes)
        return [r for r in _decode_all(result.data) if r.offset >= offset]

    async def log_end(self, stream_id: int) -> int:
        return await self.index.log_end(stream_id)

    async def log_start(self, stream_id: int) -> int:
        return await self.index.log_start(stream_id)

    async def delete_records(self, stream_id: int, offset: int) -> int:
        """Move the stream's log start to ``offset`` (-1: the log end), as Kafka's
        DeleteRecords does: records before it can no longer be read, and retention removes
        the index entries wholly before it. A log start already later stays where it is.

        Returns:
            The log start now (Kafka's "low watermark").

        Raises:
            OffsetOutOfRange: ``offset`` is past the log end, or negative other than -1.
        """
        log_end = await self.log_end(stream_id)
        if offset == -1:
            offset = log_end
        if not 0 <= offset <= log_end:
            raise OffsetOutOfRange(offset, await self.log_start(stream_id), log_end)
        await self.offset_index.move_log_start(stream_id, offset)
        return await self.log_start(stream_id)

    async def offset_for_timestamp(self, stream_id: int, timestamp_ms: int) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``."""
        return await self._reader.offset_for_timestamp(stream_id, timestamp_ms)

    async def wait_for_data(self, positions: Iterable[tuple[int, int]], max_wait: float) -> bool:
        """Wait until any ``(stream, offset)`` has data, for at most ``max_wait`` seconds."""
        return await self.index.wait_for_data(positions, max_wait)

    # --- maintenance ------------------------------------------------------------------------

    async def collect_orphans(self) -> list[str]:
        """Delete WAL objects that were never committed and are older than the grace period."""
        return await self._orphans.collect()


def _decode_all(data: bytes | bytearray | memoryview) -> list[Record]:
    out: list[Record] = []
    view = memoryview(data)
    position = 0
    while position < len(view):
        size = read_header(view, position).size
        out.extend(decode_batch(view[position : position + size])[1])
        position += size
    return out


async def _open(
    config: configuration.Config, port: type[P], context: OpenContext, opened: list[Port]
) -> P:
    adapter = await configuration.resolve_one(config, port).open(context)
    opened.append(adapter)
    return adapter


def _recompressed(
    chunks: list[bytes | bytearray | memoryview], compression: Compression
) -> list[bytes | bytearray | memoryview]:
    """``chunks`` (one batch each) with every batch stored with ``compression``."""
    out: list[bytes | bytearray | memoryview] = []
    for chunk in chunks:
        if read_header(chunk).compression is compression:
            out.append(chunk)
            continue
        out.append(recompress(chunk, compression))  # BatchError: the Kafka error to answer
    return out
