"""What each stream knows of transactions: which are open in it, which were aborted, and the
control batches (commit and abort markers) that end them.

Kafka's partition leader tracks open transactions in memory; Icefloe has no leader, so the
facts live in the metadata store, written by the transaction coordinator (any broker):

- ``txn-open/<stream>/<producer id>`` while a transaction of that producer may write to the
  stream. It holds a *lower bound* of the transaction's first offset there: the log end when
  the partition joined the transaction, before the producer could write to it. The last stable
  offset (LSO) of a stream is the least of these bounds, or its log end. Every broker caches
  the keys through a watch, and checks the store itself when a fetch meets transactional data
  its cache does not explain, so a late notification never shows uncommitted records.
- ``streams/<stream>/txn-aborted/<marker offset>`` for each aborted transaction: the producer
  and the first-offset bound, which Fetch answers read_committed consumers with (the aborted
  transactions list) and compaction uses to leave aborted records out of the tables. An abort
  records it before the open key goes, so no moment lacks both.
"""

from __future__ import annotations

import bisect
import logging
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

import msgpack

from icefloe.errors import CorruptDataError
from icefloe.keyspace import TXN_OPEN, prefix_end
from icefloe.ports.metadata import Follower, MetadataStore, WatchEvent
from icefloe.storage import keys
from icefloe.storage.records import Record, build_batch

log = logging.getLogger(__name__)

_PRODUCER_WIDTH: Final = 20
_OFFSET_WIDTH: Final = 20
ABORT: Final = 0
COMMIT: Final = 1
"""Kafka's control record types."""
MAX_ABORTED_LISTED: Final = 10_000
"""Aborted transactions one fetch answers at most (each is 12 bytes on the wire)."""


@dataclass(frozen=True, slots=True)
class OpenMark:
    """A transaction that may write to a stream."""

    producer_id: int
    epoch: int
    first_offset: int
    """At most the offset of the transaction's first record in the stream."""
    transactional_id: str


@dataclass(frozen=True, slots=True)
class AbortedTransaction:
    producer_id: int
    first_offset: int
    marker_offset: int


def control_batch(producer_id: int, epoch: int, kind: int, coordinator_epoch: int = 0) -> bytes:
    """A control batch with one COMMIT or ABORT marker of the producer's transaction."""
    key = (0).to_bytes(2, "big") + kind.to_bytes(2, "big", signed=True)
    value = (0).to_bytes(2, "big") + coordinator_epoch.to_bytes(4, "big", signed=True)
    record = Record(offset=0, timestamp=int(time.time() * 1000), key=key, value=value)
    return build_batch(
        [record],
        producer_id=producer_id,
        producer_epoch=epoch,
        is_transactional=True,
        is_control=True,
    )


def _open_dir(stream_id: int) -> str:
    return f"{TXN_OPEN}{stream_id:0{keys.STREAM_ID_WIDTH}d}/"


def _open_key(stream_id: int, producer_id: int) -> str:
    return f"{_open_dir(stream_id)}{producer_id:0{_PRODUCER_WIDTH}d}"


def _aborted_dir(stream_id: int) -> str:
    return f"{keys.stream_dir(stream_id)}/txn-aborted/"


def _aborted_key(stream_id: int, marker_offset: int) -> str:
    return f"{_aborted_dir(stream_id)}{marker_offset:0{_OFFSET_WIDTH}d}"


class TransactionMarks:
    """Open and aborted transactions per stream."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata
        self._open: dict[int, dict[int, OpenMark]] = {}
        self._changes = 0
        """Counts the cache's changes: a store read that one overtook may be stale."""
        self._follower: Follower | None = None

    async def start(self) -> None:
        watch = await self._metadata.watch(TXN_OPEN)  # before the reload: no change is missed
        await self._reload()
        self._follower = Follower(watch, self._apply, "open-transactions")

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.stop()

    # --- open transactions ------------------------------------------------------------------

    async def mark_open(self, stream_id: int, mark: OpenMark) -> None:
        value = msgpack.packb([mark.epoch, mark.first_offset, mark.transactional_id])
        await self._metadata.put(_open_key(stream_id, mark.producer_id), value)
        self._remember(stream_id, mark)

    async def clear_open(self, stream_id: int, producer_id: int) -> None:
        await self._metadata.delete(_open_key(stream_id, producer_id))
        self._forget(stream_id, producer_id)

    async def open_mark(self, stream_id: int, producer_id: int) -> OpenMark | None:
        """The producer's open transaction on the stream, checked in the store when the cache
        does not have it (the cache may not have heard of it yet)."""
        cached = self._open.get(stream_id, {}).get(producer_id)
        if cached is not None:
            return cached
        changes = self._changes
        record = await self._metadata.get(_open_key(stream_id, producer_id))
        if record is None:
            return None
        mark = _decode_open(record.key, record.value)[1]
        if self._changes == changes:
            # Cached only if the cache did not change while the store answered: the
            # transaction may have ended meanwhile, its end already applied, and no later
            # event would take back a mark remembered after it (it would hold the last stable
            # offset back for good).
            self._remember(stream_id, mark)
        return mark

    def open_marks(self, stream_id: int) -> list[OpenMark]:
        """The stream's open transactions this broker has heard of."""
        return list(self._open.get(stream_id, {}).values())

    async def stored_open_marks(self, stream_id: int) -> list[OpenMark]:
        """The stream's open transactions, read from the store (for compaction)."""
        start = _open_dir(stream_id)
        marks = []
        async for record in self._metadata.scan_all(start, prefix_end(start)):
            marks.append(_decode_open(record.key, record.value)[1])
        return marks

    def stable_offset(self, stream_id: int, log_end: int) -> int:
        """The last stable offset as far as this broker has heard: before every open
        transaction's first record."""
        return min((m.first_offset for m in self.open_marks(stream_id)), default=log_end)

    async def confirm_stable_offset(
        self, stream_id: int, log_end: int, producers: Iterable[int]
    ) -> int:
        """:meth:`stable_offset`, after checking the store for the producers whose
        transactional data was read but whose transactions the cache does not list."""
        known = self._open.get(stream_id, {})
        for producer_id in set(producers) - known.keys():
            await self.open_mark(stream_id, producer_id)
        return self.stable_offset(stream_id, log_end)

    # --- aborted transactions ---------------------------------------------------------------

    async def record_abort(self, stream_id: int, aborted: AbortedTransaction) -> None:
        value = msgpack.packb([aborted.producer_id, aborted.first_offset])
        await self._metadata.put(_aborted_key(stream_id, aborted.marker_offset), value)

    async def aborted(self, stream_id: int, start: int, end: int) -> list[AbortedTransaction]:
        """Aborted transactions that may hold records in ``[start, end)``: those whose marker
        is at or after ``start`` and whose first offset is before ``end``."""
        found = []
        scan_end = prefix_end(_aborted_dir(stream_id))
        async for record in self._metadata.scan_all(_aborted_key(stream_id, start), scan_end):
            entry = _decode_aborted(record.key, record.value)
            if entry.first_offset < end:
                found.append(entry)
                if len(found) >= MAX_ABORTED_LISTED:
                    break
        return found

    async def drop(self, stream_id: int) -> None:
        """Forget a deleted stream's transactions (its aborted list goes with its keys)."""
        start = _open_dir(stream_id)
        await self._metadata.delete_range(start, prefix_end(start))
        await self._metadata.delete_range(
            _aborted_dir(stream_id), prefix_end(_aborted_dir(stream_id))
        )
        self._open.pop(stream_id, None)

    # --- the cache --------------------------------------------------------------------------

    def _remember(self, stream_id: int, mark: OpenMark) -> None:
        self._changes += 1
        self._open.setdefault(stream_id, {})[mark.producer_id] = mark

    def _forget(self, stream_id: int, producer_id: int) -> None:
        self._changes += 1
        marks = self._open.get(stream_id)
        if marks is not None:
            marks.pop(producer_id, None)
            if not marks:
                del self._open[stream_id]

    async def _reload(self) -> None:
        loaded: dict[int, dict[int, OpenMark]] = {}
        async for record in self._metadata.scan_all(TXN_OPEN, prefix_end(TXN_OPEN)):
            try:
                stream_id, mark = _decode_open(record.key, record.value)
            except CorruptDataError as exc:
                log.warning("skipping %s: %s", record.key, exc)
                continue
            loaded.setdefault(stream_id, {})[mark.producer_id] = mark
        self._changes += 1
        self._open = loaded

    async def _apply(self, event: WatchEvent) -> None:
        if event.key is None:  # RESET
            await self._reload()
            return
        # What is read may be overtaken by a change before it is applied; that change's own
        # event follows and corrects it.
        record = await self._metadata.get(event.key)
        if record is None:
            stream_id, producer_id = _parse_open_key(event.key)
            self._forget(stream_id, producer_id)
        else:
            self._remember(*_decode_open(record.key, record.value))


def _parse_open_key(key: str) -> tuple[int, int]:
    try:
        stream, producer = key.removeprefix(TXN_OPEN).split("/")
        return int(stream), int(producer)
    except ValueError as exc:
        raise CorruptDataError(f"not an open-transaction key: {key!r}") from exc


def _decode_open(key: str, value: bytes) -> tuple[int, OpenMark]:
    stream_id, producer_id = _parse_open_key(key)
    try:
        epoch, first_offset, transactional_id = msgpack.unpackb(value)
        return stream_id, OpenMark(
            producer_id, int(epoch), int(first_offset), str(transactional_id)
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"unreadable open transaction {key}: {exc}") from exc


def _decode_aborted(key: str, value: bytes) -> AbortedTransaction:
    try:
        marker = int(key.rpartition("/")[2])
        producer_id, first_offset = msgpack.unpackb(value)
        return AbortedTransaction(int(producer_id), int(first_offset), marker)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"unreadable aborted transaction {key}: {exc}") from exc


_BATCH_FRAME: Final = struct.Struct(">qi")
"""A batch's base offset and length (of what follows the length)."""
_ATTRIBUTES_AT: Final = 21
_PRODUCER_ID_AT: Final = 43
_TRANSACTIONAL: Final = 0x10
_CONTROL: Final = 0x20


def _batches(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(position, size, base offset, attributes) of each whole batch in ``data``."""
    position = 0
    while position + _PRODUCER_ID_AT + 8 <= len(data):
        base, length = _BATCH_FRAME.unpack_from(data, position)
        size = length + _BATCH_FRAME.size
        attributes = int.from_bytes(data[position + _ATTRIBUTES_AT : position + _ATTRIBUTES_AT + 2])
        yield position, size, base, attributes
        position += size


def transactional_producers(data: bytes | bytearray | memoryview) -> set[int]:
    """Producers with transactional data batches (not markers) in ``data``."""
    found = set()
    for position, _, _, attributes in _batches(data):
        if attributes & _TRANSACTIONAL and not attributes & _CONTROL:
            found.add(_producer_id(data, position))
    return found


class TransactionalBatches:
    """Where each producer's transactional batches start in some data: its records' batches
    and its markers."""

    def __init__(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        self._records: dict[int, list[int]] = {}
        self._markers: dict[int, set[int]] = {}
        for data in parts:
            for position, _, base, attributes in _batches(data):
                if not attributes & _TRANSACTIONAL:
                    continue
                producer_id = _producer_id(data, position)
                if attributes & _CONTROL:
                    self._markers.setdefault(producer_id, set()).add(base)
                else:
                    self._records.setdefault(producer_id, []).append(base)

    @property
    def producers(self) -> set[int]:
        """Producers with records (not only markers) in the data."""
        return set(self._records)

    def hold(self, aborted: AbortedTransaction) -> bool:
        """Whether the data holds a record or the marker of the ``aborted`` transaction.

        Only then may a fetch list it: a consumer skips a listed transaction's producer's
        transactional batches from its first offset on until it meets its abort marker. The
        data files hold neither the aborted records nor the marker, so a transaction aborted
        in a range read from them, listed, would hide the producer's committed records that
        follow (in the WAL) from a read_committed consumer.
        """
        bases = self._records.get(aborted.producer_id, [])
        at = bisect.bisect_left(bases, aborted.first_offset)
        return (at < len(bases) and bases[at] < aborted.marker_offset) or (
            aborted.marker_offset in self._markers.get(aborted.producer_id, ())
        )


def _producer_id(data: bytes | bytearray | memoryview, position: int) -> int:
    at = position + _PRODUCER_ID_AT
    return int.from_bytes(data[at : at + 8], signed=True)


def cut_before(data: bytes | bytearray | memoryview, offset: int) -> bytes | bytearray | memoryview:
    """``data`` without the batches that start at or after ``offset``."""
    for position, _, base, _ in _batches(data):
        if base >= offset:
            return data[:position]
    return data
