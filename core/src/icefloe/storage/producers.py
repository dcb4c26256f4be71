"""Idempotent producers: producer ids, sequence checks, and duplicates answered on any process.

Kafka's rule is per (partition, producer): batches carry consecutive sequence numbers within an
epoch, a retried batch is acknowledged again with its original offsets, a gap is
OUT_OF_ORDER_SEQUENCE_NUMBER and an older epoch is INVALID_PRODUCER_EPOCH. A Kafka partition has
one leader to enforce it; Icefloe has none, so the state lives in the metadata store, one record
per (stream, producer), and every change to it is a compare-and-set. Before a batch is written it
is *claimed* there (pending, with a deadline); the claim serialises processes that receive the
same batch at once. The batch's offsets become known when its index entry is appended; the index
entry lists the producer batches it holds, so any process can resolve a pending claim by looking
at the index, and the claiming process writes the offsets into the record with its next claim.

A claim whose index entry never appears is void once its deadline has passed: the writer never
appends an index entry after the deadline, so the batch cannot appear later.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace
from typing import Final

import msgpack
from kio.schema.errors import ErrorCode

from icefloe.errors import ConflictError, CorruptDataError, KafkaError
from icefloe.keyspace import prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore
from icefloe.storage import counters, keys
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.locks import KeyedLocks

KEPT_BATCHES: Final = 5
"""Kafka keeps the metadata of a producer's last five batches per partition."""
PRODUCER_ID_BLOCK: Final = 1000
SEQUENCE_MODULUS: Final = 1 << 31


class ProducerError(KafkaError):
    """A batch the idempotent-producer rules reject (out of order, fenced epoch, …)."""


class ClaimPending(KafkaError):
    """Another process holds a live claim on this batch; retry shortly (REQUEST_TIMED_OUT)."""

    retriable = True

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.request_timed_out, message)


@dataclass(frozen=True, slots=True)
class SequenceRange:
    first: int
    last: int
    record_count: int
    first_offset: int | None = None
    """``None`` while the batch is claimed but not yet in the index."""


@dataclass(slots=True)
class ProducerRecord:
    """The stored state of one producer on one stream."""

    epoch: int
    batches: list[SequenceRange] = field(default_factory=list)
    deadline_ms: int = 0
    """Deadline of the pending batches (those without offsets)."""
    after_end: int = 0
    """The stream's log end when the pending batches were claimed: their entries come later."""
    version: int = MUST_NOT_EXIST

    def encode(self) -> bytes:
        payload = {
            "e": self.epoch,
            "b": [[b.first, b.last, b.record_count, b.first_offset] for b in self.batches],
            "d": self.deadline_ms,
            "a": self.after_end,
        }
        return msgpack.packb(payload)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, value: bytes, version: int) -> ProducerRecord:
        try:
            p = msgpack.unpackb(value)
            return cls(p["e"], [SequenceRange(*b) for b in p["b"]], p["d"], p["a"], version)
        except (ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(f"producer state cannot be decoded: {exc}") from exc

    @property
    def pending(self) -> list[SequenceRange]:
        return [b for b in self.batches if b.first_offset is None]


@dataclass(frozen=True, slots=True)
class Claim:
    """A batch accepted for writing: the writer must append it before ``deadline``."""

    stream_id: int
    producer_id: int
    epoch: int
    sequences: SequenceRange
    deadline: float
    """Wall-clock seconds."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A batch already in the stream: answer with its original first offset."""

    first_offset: int


class ProducerStates:
    """Producer ids and the per-stream sequence state, for one process."""

    def __init__(self, metadata: MetadataStore, index: IndexReader, claim_timeout: float) -> None:
        self._metadata = metadata
        self._index = index
        self._claim_timeout = claim_timeout
        self._ids: list[int] = []
        self._id_lock = asyncio.Lock()
        self._locks = KeyedLocks()

    async def allocate_producer_id(self) -> int:
        """A producer id unique in the cluster (allocated in blocks through the store)."""
        async with self._id_lock:
            if not self._ids:
                start = await counters.increment(self._metadata, "producer-id", PRODUCER_ID_BLOCK)
                start -= PRODUCER_ID_BLOCK
                self._ids = list(range(start + PRODUCER_ID_BLOCK - 1, start - 1, -1))
            return self._ids.pop()

    async def drop(self, stream_id: int) -> None:
        """Forget every producer's state on a stream (the stream is being deleted)."""
        prefix = keys.producers_prefix(stream_id)
        await self._metadata.delete_range(prefix, prefix_end(prefix))

    async def claim(
        self, stream_id: int, producer_id: int, epoch: int, first: int, last: int
    ) -> Claim | Duplicate:
        """Check a batch against the Kafka rules and claim it for writing.

        Raises:
            ProducerError: the batch is out of order or from a fenced epoch.
            ClaimPending: another process is writing this very batch right now.
        """
        async with self._locks.hold((stream_id, producer_id)):
            while True:
                # Read before resolving: an entry appended meanwhile still ends after it.
                log_end = await self._index.log_end(stream_id)
                state = await self._load(stream_id, producer_id)
                outcome = _check(state, epoch, first, last)
                if isinstance(outcome, Duplicate):
                    return outcome
                if outcome is _PENDING_DUPLICATE:
                    raise ClaimPending(
                        f"producer {producer_id} sequence {first} is being written by another "
                        "process"
                    )
                deadline = time.time() + self._claim_timeout
                updated = _with_claim(state, epoch, first, last, deadline)
                # Unresolved older claims keep their lower bound, so they can still be found.
                updated.after_end = state.after_end if state and state.pending else log_end
                try:
                    record = await self._metadata.put(
                        keys.producer_state(stream_id, producer_id),
                        updated.encode(),
                        expected_version=state.version if state else MUST_NOT_EXIST,
                    )
                except ConflictError:
                    continue  # someone else changed the state: check again
                updated.version = record.version
                return Claim(
                    stream_id,
                    producer_id,
                    epoch,
                    SequenceRange(first, last, last - first + 1),
                    deadline,
                )

    async def _load(self, stream_id: int, producer_id: int) -> ProducerRecord | None:
        record = await self._metadata.get(keys.producer_state(stream_id, producer_id))
        if record is None:
            return None
        state = ProducerRecord.decode(record.value, record.version)
        if state.pending:
            await self._resolve(stream_id, producer_id, state)
        return state

    async def _resolve(self, stream_id: int, producer_id: int, state: ProducerRecord) -> None:
        """Give pending batches the offsets their index entries got, or drop void claims."""
        found: dict[tuple[int, int], int] = {}
        async for entry in self._index.entries(stream_id, after_end=state.after_end):
            for p in entry.producers:
                if p.producer_id == producer_id and p.producer_epoch == state.epoch:
                    found[(p.first_sequence, p.last_sequence)] = entry.start + p.offset_delta
        # The margin covers an index append that was sent just before the deadline.
        expired = time.time() * 1000 > state.deadline_ms + self._claim_timeout * 1000
        resolved = []
        for batch in state.batches:
            if batch.first_offset is None:
                offset = found.get((batch.first, batch.last))
                if offset is not None:
                    batch = replace(batch, first_offset=offset)
                elif expired:
                    continue  # never written, and now it never will be
            resolved.append(batch)
        state.batches = resolved


_PENDING_DUPLICATE: Final = object()


def _check(
    state: ProducerRecord | None, epoch: int, first: int, last: int
) -> Duplicate | object | None:
    """Kafka's sequence rules. ``None`` means "append it"."""
    if state is None:
        # No state: a new producer, or one whose state expired. Kafka accepts it as is.
        return None
    if epoch < state.epoch:
        raise ProducerError(
            ErrorCode.invalid_producer_epoch,
            f"producer epoch {epoch} is older than the current epoch {state.epoch}",
        )
    if epoch > state.epoch:
        if first != 0:
            raise ProducerError(
                ErrorCode.out_of_order_sequence_number,
                f"a new producer epoch must start at sequence 0, got {first}",
            )
        return None
    for batch in state.batches:
        if batch.first == first and batch.last == last:
            return (
                Duplicate(batch.first_offset)
                if batch.first_offset is not None
                else (_PENDING_DUPLICATE)
            )
    if state.batches:
        expected = (state.batches[-1].last + 1) % SEQUENCE_MODULUS
        if first != expected:
            raise ProducerError(
                ErrorCode.out_of_order_sequence_number,
                f"out of order sequence number: expected {expected}, got {first}",
            )
    return None


def _with_claim(
    state: ProducerRecord | None, epoch: int, first: int, last: int, deadline: float
) -> ProducerRecord:
    batches = [] if state is None or epoch != state.epoch else list(state.batches)
    batches.append(SequenceRange(first, last, last - first + 1))
    return ProducerRecord(
        epoch=epoch,
        batches=batches[-KEPT_BATCHES:],
        deadline_ms=int(deadline * 1000),
        version=state.version if state else MUST_NOT_EXIST,
    )
