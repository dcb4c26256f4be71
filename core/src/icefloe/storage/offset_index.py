"""The offset index, written in one place: the only module that adds, replaces or removes index
entries (``streams/<id>/index-…``; see :mod:`icefloe.keyspace`).

A stream's index is the sequence of its entries in end-offset order; each entry covers the
offsets ``[end - record_count, end)`` and says where their batches are: a chunk of a WAL object,
or a compacted Parquet file. Four operations change it, and each keeps these invariants
(``docs/design.md``, "Invariants"):

- **append** (the WAL writer, after the WAL object is durable): the store assigns the key, end
  offset and cumulative size atomically, so offsets strictly increase, with no gap and no
  overlap (invariant 1), and an entry exists only for durable bytes (invariant 3).
- **swap** (the compaction committer): consecutive entries are replaced by Parquet entries
  over the same offsets (one, or one per hour or day of a time-partitioned table). The last
  takes the key of the *last* entry it replaces (same end offset, same cumulative size), then
  the others are deleted from the last to the first, so that a look-up of any offset always
  finds an entry that holds it, before, during and after the swap (invariant 4: consumers read
  the same records). Where the store has multi-key transactions, the deletes go a chunk at a
  time, each chunk in one transaction: one commit for many entries, in the same order.
- **expire** (retention): entries leave from the front only, oldest first, and never the last
  one, which carries the log end offset (it never goes back).
- **drop** (deleting a stream): every entry goes; the stream's WAL objects become orphans.

One more record belongs to the index: the stream's **log start** as DeleteRecords sets it
(``streams/<id>/log-start``, written here too). It only moves forward, by compare-and-set, and
is never past the log end; readers refuse offsets below it even where an index entry still
holds them, and retention removes the entries wholly below it (never the last one).

Garbage collection (:mod:`icefloe.storage.orphans`) reads the index but never writes it: a WAL
object is deleted only when no entry references it (invariant 6).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

from icefloe.errors import ConflictError
from icefloe.ports.metadata import (
    MUST_NOT_EXIST,
    TRANSACTION_WRITES,
    Delete,
    MetadataStore,
    SequenceAppend,
)
from icefloe.storage import index, keys
from icefloe.storage.index import IndexEntry, Location, ParquetLocation, ProducerBatch
from icefloe.storage.index_reader import IndexReader, decode_log_start, encode_log_start

log = logging.getLogger(__name__)

KEPT_PRODUCER_BATCHES: Final = 5
"""Idempotent batches kept per producer in a swapped entry: as many as a producer may have in
flight, so that a retry of any of them is still recognised after compaction."""


class OffsetIndex:
    """Changes to every stream's offset index; see the module docstring for the invariants."""

    def __init__(self, metadata: MetadataStore, reader: IndexReader) -> None:
        self._metadata = metadata
        self._reader = reader

    async def append(self, chunks: Sequence[NewEntry]) -> list[IndexEntry | BaseException]:
        """Append an entry for each chunk to its stream's index, the store giving it the next
        offsets; call only once the chunks' bytes are durable. The appends go to the store
        together (one commit where it can), and each stands alone: the outcome of each, in
        order, is its entry or the exception that kept it out."""
        outcomes = await self._metadata.append_sequences(
            [
                SequenceAppend(
                    keys.index_sequence(chunk.stream_id),
                    chunk.encode(),
                    (chunk.record_count, chunk.size),
                )
                for chunk in chunks
            ]
        )
        entries: list[IndexEntry | BaseException] = []
        for chunk, outcome in zip(chunks, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                entries.append(outcome)
                continue
            entry = chunk.entry(outcome.key)
            self._reader.remember(entry, outcome.version)
            entries.append(entry)
        return entries

    async def swap(self, replaced: Sequence[str], pieces: Sequence[NewPiece]) -> bool:
        """Replace the consecutive entries under the keys ``replaced`` (in offset order) by
        one entry per Parquet piece; the pieces, in offset order, hold exactly the replaced
        offsets. Idempotent: a swap that already happened, in whole or in part, is finished.

        The last piece takes the last replaced key. Each other piece takes the key of its end
        offset with the cumulative size of the first replaced key that ends at or after it (the
        same key as a replaced entry that ends where it does), so a replay computes the same
        keys. Pieces are written first to last, then the replaced entries not reused are
        deleted from the last to the first: every offset stays held by some entry.

        Returns:
            ``False`` when the last of them is gone (the stream was deleted): nothing to do.

        Raises:
            ConflictError: the last entry changed meanwhile; try again later.
        """
        last_key = replaced[-1]
        current = await self._metadata.get(last_key)
        if current is None:
            return False
        stream_id, last_end, _ = keys.parse_index_key(last_key)
        if pieces[-1].end_offset != last_end:
            raise ValueError(f"pieces end at {pieces[-1].end_offset}, the entries at {last_end}")
        bounds = [keys.parse_index_key(k)[1:] for k in replaced]  # (end, cumulative)
        piece_keys = [
            keys.index_key(stream_id, end, next(c for e, c in bounds if e >= end))
            for end in (piece.end_offset for piece in pieces[:-1])
        ]
        if index.decode(current.key, current.value).location != pieces[-1].location:
            entries = await self._provenance(replaced)
            # When the records were written, not compacted: retention counts from it.
            created_ms = max(e.created_ms for e in entries)
            for key, piece in zip(piece_keys, pieces, strict=False):
                await self._metadata.put(key, piece.encode(created_ms, ()))
            last = pieces[-1]
            value = last.encode(created_ms, _kept_producer_batches(entries, last.start_offset))
            try:
                await self._metadata.put(last_key, value, expected_version=current.version)
            except ConflictError:
                log.warning("index entry %s changed during the swap; retrying later", last_key)
                raise
        kept = {last_key, *piece_keys}
        await self._delete_in_order([key for key in reversed(replaced) if key not in kept])
        return True

    async def _delete_in_order(self, doomed: Sequence[str]) -> None:
        """Delete the entries under ``doomed`` in that order (last to first: no look-up ever
        sees a gap), a chunk per transaction where the store has them."""
        if not self._metadata.supports(MetadataStore.MULTI_KEY_TRANSACTION):
            for key in doomed:
                await self._metadata.delete(key)
            return
        # One by one, each delete is a commit of its own, and the WAL writer's index appends
        # queue behind them while compaction catches up.
        for at in range(0, len(doomed), TRANSACTION_WRITES):
            chunk = doomed[at : at + TRANSACTION_WRITES]
            await self._metadata.transact([], [Delete(key) for key in chunk])

    async def expire(self, stream_id: int, entries: Sequence[IndexEntry]) -> int:
        """Remove ``entries``, which must be the first entries of the stream, oldest first;
        the stream's last entry always stays. Returns how many were removed."""
        if not entries:
            return 0
        removed = 0
        last = await self._reader.last_entry(stream_id)
        for entry in entries:
            first = await self._reader.first_entry(stream_id)
            if first is None or first.end != entry.end or last is None or entry.end >= last.end:
                break  # not the front any more, or the last entry: leave the rest
            await self._metadata.delete(keys.index_key(stream_id, entry.end, entry.cumulative_size))
            self._reader.forget(entry)
            removed += 1
        return removed

    async def move_log_start(self, stream_id: int, offset: int) -> int:
        """Raise the stream's log start to ``offset`` (the caller checked it is not past the
        log end); a log start already there or later stays. Idempotent; one compare-and-set.

        Returns:
            The log start now recorded.
        """
        key = keys.log_start(stream_id)
        while True:
            record = await self._metadata.get(key)
            current = 0 if record is None else decode_log_start(record.value)
            if offset <= current:
                self._reader.log_start_moved(stream_id, current)
                return current
            try:
                await self._metadata.put(
                    key,
                    encode_log_start(offset),
                    expected_version=MUST_NOT_EXIST if record is None else record.version,
                )
            except ConflictError:
                continue  # another DeleteRecords moved it meanwhile: compare again
            self._reader.log_start_moved(stream_id, offset)
            return offset

    def entries(self, stream_id: int) -> AsyncIterator[IndexEntry]:
        """The stream's entries as stored now, in offset order (read from the store)."""
        return self._reader.entries(stream_id)

    async def drop(self, stream_id: int) -> None:
        """Remove every entry of the stream, and its recorded log start."""
        await self._metadata.delete_range(*keys.index_range(stream_id))
        await self._metadata.delete(keys.log_start(stream_id))

    async def _provenance(self, keys_: Sequence[str]) -> list[index.Provenance]:
        """What the swap keeps of the entries still stored under ``keys_``, in key order: one
        range scan, not a read per key (a run may replace thousands of consecutive entries)."""
        wanted = set(keys_)
        if not wanted:
            return []
        return [
            index.decode_provenance(record.key, record.value)
            async for record in self._metadata.scan_all(min(wanted), max(wanted) + "\x01")
            if record.key in wanted
        ]


@dataclass(frozen=True, slots=True)
class NewEntry:
    """A durable chunk of a stream, for :meth:`OffsetIndex.append`."""

    stream_id: int
    record_count: int
    size: int
    """Bytes the chunk holds (the second component of its index key)."""
    location: Location
    min_timestamp: int
    max_timestamp: int
    created_ms: int
    batches: tuple[index.BatchRef, ...]
    producers: tuple[ProducerBatch, ...]

    def encode(self) -> bytes:
        return index.encode_value(**self._value_fields())

    def entry(self, key: str) -> IndexEntry:
        """The entry as ``index.decode`` would give it from ``key`` and the value written, built
        without decoding what was just encoded."""
        _, end, cumulative_size = keys.parse_index_key(key)
        return IndexEntry(
            stream_id=self.stream_id,
            end=end,
            cumulative_size=cumulative_size,
            **self._value_fields(),
        )

    def _value_fields(self) -> dict[str, Any]:
        """What the index value holds: the entry's fields but those its key carries."""
        return {
            "record_count": self.record_count,
            "location": self.location,
            "min_timestamp": self.min_timestamp,
            "max_timestamp": self.max_timestamp,
            "created_ms": self.created_ms,
            "batches": self.batches,
            "producers": self.producers,
        }


@dataclass(frozen=True, slots=True)
class NewPiece:
    """A Parquet file that takes over offsets ``[start_offset, end_offset)`` in a swap."""

    location: ParquetLocation
    start_offset: int
    end_offset: int
    min_timestamp: int
    max_timestamp: int

    def encode(self, created_ms: int, producers: tuple[ProducerBatch, ...]) -> bytes:
        return index.encode_value(
            record_count=self.end_offset - self.start_offset,
            location=self.location,
            min_timestamp=self.min_timestamp,
            max_timestamp=self.max_timestamp,
            created_ms=created_ms,
            batches=(),
            producers=producers,
        )


def _kept_producer_batches(
    entries: Sequence[index.Provenance], start: int
) -> tuple[ProducerBatch, ...]:
    """The last few idempotent batches per producer of the replaced entries, with their offset
    deltas moved to the new entry's start."""
    kept: dict[int, list[ProducerBatch]] = {}
    for entry in entries:
        for p in entry.producers:
            moved = ProducerBatch(
                p.producer_id,
                p.producer_epoch,
                p.first_sequence,
                p.last_sequence,
                entry.start + p.offset_delta - start,
                p.record_count,
            )
            kept.setdefault(p.producer_id, []).append(moved)
    return tuple(b for batches in kept.values() for b in batches[-KEPT_PRODUCER_BATCHES:])
