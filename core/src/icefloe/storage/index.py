"""Offset-index entries: what one committed chunk of a stream holds and where its bytes are.

An entry covers offsets ``[start, end)``. Its key (see :mod:`icefloe.storage.keys`) carries the
end offset and the stream's cumulative size; the value, encoded with msgpack, carries the rest.
The start offset is not stored: it is ``end - record_count``, because the key is assigned by the
metadata store's sequenced append only after the value has been written.

Entries and their parts are named tuples rather than frozen dataclasses, which are as
immutable but take several times longer to build: every append builds an entry, and a
compaction run decodes thousands.
"""

from __future__ import annotations

from typing import Any, Final, NamedTuple

import msgpack

from icefloe.errors import CorruptDataError
from icefloe.storage import keys

FORMAT_VERSION: Final = 1


class BatchRef(NamedTuple):
    """One record batch inside a chunk: enough to seek without reading the chunk."""

    offset_delta: int
    """First offset of the batch minus the entry's start offset."""
    position: int
    """Byte position of the batch within the chunk."""
    length: int
    record_count: int
    max_timestamp: int


class ProducerBatch(NamedTuple):
    """An idempotent producer's batch inside a chunk, for duplicate detection on any process."""

    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int
    offset_delta: int
    """First offset of the batch minus the entry's start offset."""
    record_count: int


class WalLocation(NamedTuple):
    """A chunk of a WAL object: one ranged read of ``[position, position + length)``."""

    ref: str
    position: int
    length: int

    def describe(self) -> str:
        return f"WAL object {self.ref!r}"


class ParquetLocation(NamedTuple):
    """A compacted data file holding the whole entry, and the offsets of its row groups."""

    key: str
    """Object-store key of the Parquet file."""
    size: int
    row_groups: tuple[tuple[int, int], ...]
    """``(first offset, last offset)`` of each row group, in order."""

    def describe(self) -> str:
        return f"Parquet file {self.key!r}"

    def row_groups_from(self, offset: int) -> list[int]:
        """Indices of the row groups holding ``offset`` and everything after it."""
        return [i for i, (_, last) in enumerate(self.row_groups) if last >= offset]


Location = WalLocation | ParquetLocation
"""Where an entry's batches are."""


class IndexEntry(NamedTuple):
    stream_id: int
    end: int
    cumulative_size: int
    record_count: int
    location: Location
    min_timestamp: int
    max_timestamp: int
    created_ms: int
    batches: tuple[BatchRef, ...]
    producers: tuple[ProducerBatch, ...] = ()

    @property
    def start(self) -> int:
        return self.end - self.record_count

    @property
    def size(self) -> int:
        location = self.location
        return location.length if isinstance(location, WalLocation) else location.size

    @property
    def in_wal(self) -> bool:
        return isinstance(self.location, WalLocation)

    def batches_from(self, offset: int) -> tuple[BatchRef, ...]:
        """The batches holding ``offset`` and everything after it within this entry."""
        delta = offset - self.start
        for i, batch in enumerate(self.batches):
            if batch.offset_delta + batch.record_count > delta:
                return self.batches[i:]
        return ()


def encode_value(
    *,
    record_count: int,
    location: WalLocation | ParquetLocation,
    min_timestamp: int,
    max_timestamp: int,
    created_ms: int,
    batches: tuple[BatchRef, ...],
    producers: tuple[ProducerBatch, ...] = (),
) -> bytes:
    """The index value of a WAL chunk (the key is assigned when it is appended)."""
    payload: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "n": record_count,
        "ts": [min_timestamp, max_timestamp],
        "at": created_ms,
        "b": [
            [b.offset_delta, b.position, b.length, b.record_count, b.max_timestamp] for b in batches
        ],
    }
    if isinstance(location, WalLocation):
        payload["wal"] = [location.ref, location.position, location.length]
    else:
        payload["pq"] = [location.key, location.size, [list(g) for g in location.row_groups]]
    if producers:
        payload["p"] = [
            [
                p.producer_id,
                p.producer_epoch,
                p.first_sequence,
                p.last_sequence,
                p.offset_delta,
                p.record_count,
            ]
            for p in producers
        ]
    return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]


_UNDECODABLE: Final = (ValueError, KeyError, TypeError, msgpack.UnpackException)
"""What a malformed key or value raises while it is taken apart (CorruptDataError is none)."""


def _payload(key: str, value: bytes) -> dict[str, Any]:
    """The value's fields, checked to be a map of the format this module writes."""
    payload = msgpack.unpackb(value, raw=False)
    if not isinstance(payload, dict):
        raise CorruptDataError(f"index entry {key!r} is not a map")
    if payload.get("v") != FORMAT_VERSION:
        raise CorruptDataError(f"index entry {key!r} has unknown version {payload.get('v')!r}")
    return payload


def _undecodable(key: str, exc: Exception) -> CorruptDataError:
    return CorruptDataError(f"index entry {key!r} cannot be decoded: {exc}")


class Provenance(NamedTuple):
    """What a compaction swap keeps of each entry it replaces: when its records were written
    and the idempotent batches in it (:func:`decode_provenance`)."""

    start: int
    created_ms: int
    producers: tuple[ProducerBatch, ...]


def decode_provenance(key: str, value: bytes) -> Provenance:
    """:func:`decode` of only what :class:`Provenance` holds: a swap replaces thousands of
    entries, and building each one's batches and location was most of its cost."""
    try:
        _, end, _ = keys.parse_index_key(key)
        payload = _payload(key, value)
        producers = tuple(ProducerBatch(*p) for p in payload.get("p", ()))
        return Provenance(end - payload["n"], payload["at"], producers)
    except _UNDECODABLE as exc:
        raise _undecodable(key, exc) from exc


def decode(key: str, value: bytes) -> IndexEntry:
    """Parse an index record; raises :class:`CorruptDataError` if it is not one."""
    try:
        stream_id, end, cumulative = keys.parse_index_key(key)
        payload = _payload(key, value)
        location: WalLocation | ParquetLocation
        if "wal" in payload:
            location = WalLocation(*payload["wal"])
        else:
            file_key, size, groups = payload["pq"]
            location = ParquetLocation(file_key, size, tuple((g[0], g[1]) for g in groups))
        min_ts, max_ts = payload["ts"]
        return IndexEntry(
            stream_id=stream_id,
            end=end,
            cumulative_size=cumulative,
            record_count=payload["n"],
            location=location,
            min_timestamp=min_ts,
            max_timestamp=max_ts,
            created_ms=payload["at"],
            batches=tuple(BatchRef(*b) for b in payload["b"]),
            producers=tuple(ProducerBatch(*p) for p in payload.get("p", ())),
        )
    except _UNDECODABLE as exc:
        raise _undecodable(key, exc) from exc
