"""Idempotent producers: producer ids, sequence checks, and duplicates answered on any process.

Kafka's rule is per (partition, producer): batches carry consecutive sequence numbers within an
epoch, a retried batch is acknowledged again with its original offsets, a gap is
OUT_OF_ORDER_SEQUENCE_NUMBER and an older epoch is INVALID_PRODUCER_EPOCH. A Kafka partition has
one leader to enforce it; Icefloe has none, so each (stream, producer) has a *lease*: a record in
the metadata store naming the one process that may accept new batches of that producer on that
stream until a deadline. The owner checks sequences in memory, with no store round trip per
batch, and renews the lease in the background while the producer is active; it releases the
lease once the producer has been idle for a moment, which is how a producer that moves to
another broker is handed over.

A claim through the store reads the log end, the record and the index entries after it, then
writes the record. Two common claims need only the write: a lease this process released and
nobody took since (the record's version is the one it released, so the state it kept is the
whole truth), taken back by one compare-and-set, which is what a producer sending every few
seconds does after each pause; and the first claim of a producer this process gave its id to,
made by creating the record (if it does not exist, no batch of that producer was ever
accepted on the stream: every one needs the lease).

Every index entry lists the producer batches it holds, so the index is the truth about what
was written; the lease record is a summary (the last batches, and ``after_end``: a log end
before every batch the record does not list). Any process answers a retried batch by looking
in the index, without the lease. A process that takes a lease over — because it was released,
or because its owner died and its deadline passed by a margin — rebuilds the state from the
record and the index entries after ``after_end``.

The writer never appends an index entry after the deadline of the lease that accepted its
batch, and the deadline only moves once the store holds the new one; the margin covers an
append sent just before it. So once a lease has lapsed, nothing of its owner's can appear later.

A batch whose write failed takes every batch of its producer accepted after it down with it:
written without it, they would leave a gap in the producer's sequence. A batch that follows a
gap — its predecessor failed, or is still on its way through this process or another — is
refused with a retriable error (:class:`SequenceGap`), never OUT_OF_ORDER_SEQUENCE_NUMBER:
clients retry the first without a new epoch and their batches come back in order, where
OUT_OF_ORDER_SEQUENCE_NUMBER makes librdkafka bump the producer epoch and renumber every batch
it has not had acknowledged, on every partition. One of those may already be written, under
the old epoch; under the new one it would be written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

import msgpack
from kio.schema.errors import ErrorCode

from icefloe.errors import ConflictError, CorruptDataError, IcefloeError, KafkaError
from icefloe.keyspace import prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore
from icefloe.storage import counters, keys
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.locks import KeyedLocks

log = logging.getLogger(__name__)

KEPT_BATCHES: Final = 5
"""Kafka keeps the metadata of a producer's last five batches per partition."""
PRODUCER_ID_BLOCK: Final = 1000
SEQUENCE_MODULUS: Final = 1 << 31
IDLE_RELEASE_S: Final = 1.0
"""A lease whose producer sent nothing for this long, with nothing in flight, is released."""
RELEASED_KEPT: Final = 8192
"""Leases this process released whose state it keeps to take them back (a few hundred bytes
each)."""
HANDED_OUT_KEPT: Final = 8192
"""Producer ids this process handed out that it remembers as its own, newest first."""
HANDOFF_WAIT_S: Final = 3.0
"""How long a claim waits for another process to release the lease before answering
REQUEST_TIMED_OUT (longer than :data:`IDLE_RELEASE_S`, so a producer that moved is served)."""


PRODUCER_ID_EXPIRATION_MS: Final = 24 * 3600 * 1000
"""Kafka's ``producer.id.expiration.ms``: a producer idle this long is no longer described as
active (its record stays, so a late retry is still recognised)."""


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """What DescribeProducers reports of one producer on one stream."""

    producer_id: int
    epoch: int
    last_sequence: int
    """The last sequence number written or accepted (-1 if none is known)."""


class ProducerError(KafkaError):
    """A batch the idempotent-producer rules reject (out of order, fenced epoch, …)."""


class SequenceGap(ProducerError):
    """A batch that does not follow the last one of its producer, with nothing lost: an earlier
    batch failed or is still being written, and the client will send it again first
    (NOT_ENOUGH_REPLICAS, which every client retries as it is, "not written")."""

    retriable = True

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.not_enough_replicas, message)


class ClaimPending(KafkaError):
    """Another process holds this producer's lease, or writes this very batch; retry shortly
    (REQUEST_TIMED_OUT)."""

    retriable = True

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.request_timed_out, message)


@dataclass(frozen=True, slots=True)
class SequenceRange:
    first: int
    last: int
    record_count: int
    first_offset: int | None = None
    """``None`` while the batch is accepted but not yet in the index."""


@dataclass(slots=True)
class ProducerRecord:
    """The stored state of one producer on one stream: its lease and its last batches."""

    epoch: int
    batches: list[SequenceRange] = field(default_factory=list)
    deadline_ms: int = 0
    """Until when the owner may append this producer's batches (wall-clock ms)."""
    after_end: int = 0
    """A log end before every batch of this producer that :attr:`batches` does not resolve."""
    owner: str = ""
    """The process holding the lease; empty once released."""
    version: int = MUST_NOT_EXIST

    def encode(self) -> bytes:
        payload = {
            "e": self.epoch,
            "b": [[b.first, b.last, b.record_count, b.first_offset] for b in self.batches],
            "d": self.deadline_ms,
            "a": self.after_end,
            "o": self.owner,
        }
        return msgpack.packb(payload)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, value: bytes, version: int) -> ProducerRecord:
        try:
            p = msgpack.unpackb(value)
            batches = [SequenceRange(*b) for b in p["b"]]
            owner = p.get("o", "")
            if not isinstance(owner, str):
                raise TypeError(f"owner is a {type(owner).__name__}")
            return cls(p["e"], batches, p["d"], p["a"], owner, version)
        except (ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(f"producer state cannot be decoded: {exc}") from exc

    @property
    def pending(self) -> list[SequenceRange]:
        return [b for b in self.batches if b.first_offset is None]


@dataclass(frozen=True, slots=True)
class Claim:
    """A batch accepted for writing: the writer appends it only while
    :meth:`ProducerStates.may_append` says so."""

    stream_id: int
    producer_id: int
    epoch: int
    sequences: SequenceRange
    deadline: float
    """The lease deadline when the batch was accepted (wall-clock seconds)."""
    lease: _Lease = field(compare=False, repr=False)
    """The lease that accepted it."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A batch already in the stream: answer with its original first offset."""

    first_offset: int


@dataclass(eq=False, slots=True)
class _Lease:
    """This process's lease on one (stream, producer): the state it checks batches against."""

    stream_id: int
    producer_id: int
    state: ProducerRecord
    in_flight: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """(epoch, first, last) of accepted batches not yet committed → the log end seen before, in
    the order they were accepted."""
    void: set[tuple[int, int, int]] = field(default_factory=set)
    """Batches in flight that may no longer be written: they follow one whose write failed."""
    last_used: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.state.deadline_ms / 1000

    def after_end(self, log_end_hint: int | None) -> int:
        """What the stored record may say as ``after_end`` now."""
        if self.in_flight:
            return min(self.in_flight.values())
        return self.state.after_end if log_end_hint is None else log_end_hint


class ProducerStates:
    """Producer ids and the per-stream producer leases, for one process."""

    def __init__(self, metadata: MetadataStore, index: IndexReader, lease_s: float) -> None:
        self._metadata = metadata
        self._index = index
        self._lease_s = lease_s
        self._id = uuid.uuid4().hex
        """Names this process as a lease owner; a restarted process is a stranger to its past."""
        self._ids: list[int] = []
        self._id_lock = asyncio.Lock()
        self._locks = KeyedLocks()
        self._leases: dict[tuple[int, int], _Lease] = {}
        self._released: OrderedDict[tuple[int, int], ProducerRecord] = OrderedDict()
        """The state each lease had when this process released it, newest last."""
        self._handed_out: OrderedDict[int, None] = OrderedDict()
        """Producer ids this process allocated, newest last."""
        self._upkeep: asyncio.Task[None] | None = None

    async def allocate_producer_id(self) -> int:
        """A producer id unique in the cluster (allocated in blocks through the store)."""
        async with self._id_lock:
            if not self._ids:
                start = await counters.increment(self._metadata, "producer-id", PRODUCER_ID_BLOCK)
                start -= PRODUCER_ID_BLOCK
                self._ids = list(range(start + PRODUCER_ID_BLOCK - 1, start - 1, -1))
            producer_id = self._ids.pop()
        self._handed_out[producer_id] = None
        while len(self._handed_out) > HANDED_OUT_KEPT:
            self._handed_out.popitem(last=False)
        return producer_id

    async def drop(self, stream_id: int) -> None:
        """Forget every producer's state on a stream (the stream is being deleted)."""
        for key in [k for k in self._leases if k[0] == stream_id]:
            del self._leases[key]
        for key in [k for k in self._released if k[0] == stream_id]:
            del self._released[key]
        prefix = keys.producers_prefix(stream_id)
        await self._metadata.delete_range(prefix, prefix_end(prefix))

    async def describe(self, stream_id: int, limit: int) -> list[ActiveProducer]:
        """The stream's idempotent producers active within :data:`PRODUCER_ID_EXPIRATION_MS`,
        at most ``limit`` of them (the lowest producer ids first), each with its epoch and last
        sequence: this process's lease where it holds one, else the stored record brought up to
        date with the index."""
        prefix = keys.producers_prefix(stream_id)
        cutoff = time.time() * 1000 - PRODUCER_ID_EXPIRATION_MS
        found: list[ActiveProducer] = []
        async for record in self._metadata.scan_all(prefix, prefix_end(prefix)):
            if len(found) >= limit:
                break
            try:
                producer_id = int(record.key[len(prefix) :])
            except ValueError:
                continue
            lease = self._leases.get((stream_id, producer_id))
            state = lease.state if lease is not None else None
            if state is None:
                stored = ProducerRecord.decode(record.value, record.version)
                if stored.deadline_ms < cutoff and not self._held(stored):
                    continue
                state, _ = await self._load(stream_id, producer_id)
                if state is None:
                    continue
            last = state.batches[-1].last if state.batches else -1
            found.append(ActiveProducer(producer_id, state.epoch, last))
        return found

    async def close(self) -> None:
        """Stop renewing and release every lease (call once nothing is in flight)."""
        if self._upkeep is not None:
            self._upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._upkeep
            self._upkeep = None
        for key, lease in list(self._leases.items()):
            async with self._locks.hold(key):
                if self._leases.get(key) is lease and not lease.in_flight:
                    with contextlib.suppress(IcefloeError):
                        await self._release(lease)
        self._leases.clear()
        self._released.clear()

    # --- claims -----------------------------------------------------------------------------

    async def claim(
        self, stream_id: int, producer_id: int, epoch: int, first: int, last: int
    ) -> Claim | Duplicate:
        """Check a batch against the Kafka rules and accept it for writing.

        Raises:
            ProducerError: the batch is out of order or from a fenced epoch.
            ClaimPending: another process holds the lease, or writes this batch, right now.
        """
        key = (stream_id, producer_id)
        async with self._locks.hold(key):
            lease = self._leases.get(key)
            if lease is not None and lease.deadline - time.time() > self._lease_s / 4:
                return self._accept(lease, epoch, first, last)
            return await self._claim_through_store(stream_id, producer_id, epoch, first, last)

    def may_append(self, claim: Claim, now: float) -> bool:
        """Whether the writer may still append ``claim``'s batch at wall-clock time ``now``:
        before its lease's deadline (which renewals move on while the batch is in flight), and
        not after a batch of its producer whose write failed."""
        lease, accepted = claim.lease, _accepted(claim)
        if accepted in lease.void:
            return False
        deadline = lease.deadline if accepted in lease.in_flight else claim.deadline
        return now <= max(deadline, claim.deadline)

    def committed(self, claim: Claim, first_offset: int) -> None:
        """The writer appended ``claim``'s batch at ``first_offset``."""
        lease, accepted = claim.lease, _accepted(claim)
        if lease.in_flight.pop(accepted, None) is None:
            return
        lease.state.batches = [
            SequenceRange(b.first, b.last, b.record_count, first_offset)
            if (lease.state.epoch, b.first, b.last) == accepted and b.first_offset is None
            else b
            for b in lease.state.batches
        ]

    def failed(self, claim: Claim, *, maybe_written: bool) -> None:
        """The writer could not append ``claim``'s batch.

        Every batch of the producer accepted after it is void: the writer must not append it
        (it would follow a gap), and fails it too. A batch surely not written (the WAL write
        failed, or it was never committed) leaves the lease with its last written batch, so the
        client's retry is accepted at once. One that ``maybe_written`` (the index commit failed
        half-way) drops the lease from memory: its next claim goes through the store and, like
        any other process, waits until the lease has lapsed, when the index tells what landed.
        """
        lease, accepted = claim.lease, _accepted(claim)
        if accepted not in lease.in_flight:
            return
        accepted_order = list(lease.in_flight)
        later = accepted_order[accepted_order.index(accepted) + 1 :]
        lease.void.update(later)
        key = (claim.stream_id, claim.producer_id)
        if maybe_written:
            if self._leases.get(key) is lease:
                del self._leases[key]
            return
        del lease.in_flight[accepted]
        lease.void.discard(accepted)
        gone = {accepted, *later}
        lease.state.batches = [
            b
            for b in lease.state.batches
            if b.first_offset is not None or (lease.state.epoch, b.first, b.last) not in gone
        ]

    def _accept(self, lease: _Lease, epoch: int, first: int, last: int) -> Claim | Duplicate:
        """Check and accept a batch against a lease held in memory: no store round trip."""
        outcome = _check(lease.state, epoch, first, last)
        if isinstance(outcome, Duplicate):
            return outcome
        if outcome is _PENDING_DUPLICATE:
            raise ClaimPending(
                f"producer {lease.producer_id} sequence {first} is still being written"
            )
        state = lease.state
        if epoch != state.epoch:
            state.epoch, state.batches = epoch, []
        state.batches = [*state.batches, SequenceRange(first, last, last - first + 1)][
            -KEPT_BATCHES:
        ]
        hint = self._index.log_end_hint(lease.stream_id)
        lease.in_flight[(epoch, first, last)] = state.after_end if hint is None else hint
        lease.last_used = time.monotonic()
        return Claim(
            lease.stream_id,
            lease.producer_id,
            epoch,
            SequenceRange(first, last, last - first + 1),
            lease.deadline,
            lease,
        )

    async def _claim_through_store(
        self, stream_id: int, producer_id: int, epoch: int, first: int, last: int
    ) -> Claim | Duplicate:
        """Answer a duplicate from the index, or take the lease and accept the batch."""
        self._leases.pop((stream_id, producer_id), None)
        quick = await self._take_back(stream_id, producer_id, epoch, first, last)
        if quick is None:
            quick = await self._create(stream_id, producer_id, epoch, first, last)
        if quick is not None:
            return quick
        give_up = time.monotonic() + HANDOFF_WAIT_S
        pause = 0.01
        while True:
            # Read before resolving: an entry appended meanwhile still ends after it.
            log_end = await self._index.log_end(stream_id)
            state, held = await self._load(stream_id, producer_id)
            try:
                outcome = _check(state, epoch, first, last)
            except ProducerError:
                if not held:
                    raise
                # The owner's state in memory may be ahead of the record: its answer decides.
                outcome = _PENDING_DUPLICATE
            if isinstance(outcome, Duplicate):
                return outcome
            if held or outcome is _PENDING_DUPLICATE:
                if time.monotonic() >= give_up:
                    raise ClaimPending(
                        f"producer {producer_id} is being served by another broker process "
                        "until its lease is released or lapses"
                    )
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            taken = await self._take(stream_id, producer_id, state, log_end, epoch, first, last)
            if taken is not None:
                return taken
            # Someone else changed the state: check again.

    async def _take_back(
        self, stream_id: int, producer_id: int, epoch: int, first: int, last: int
    ) -> Claim | Duplicate | None:
        """Take back a lease this process released, if nobody has written its record since
        (then the state released is still the whole truth: every batch needs the lease), and
        accept the batch; ``None`` where the store must be read instead."""
        released = self._released.pop((stream_id, producer_id), None)
        if released is None:
            return None
        # Only a batch the released state accepts: any other answer (a duplicate, a gap, an
        # older epoch) may be out of date and is given by the full claim.
        try:
            if _check(released, epoch, first, last) is not None:
                return None
        except ProducerError:
            return None
        return await self._take(
            stream_id, producer_id, released, released.after_end, epoch, first, last
        )

    async def _create(
        self, stream_id: int, producer_id: int, epoch: int, first: int, last: int
    ) -> Claim | Duplicate | None:
        """Take the lease of a producer this process gave its id to by creating its record,
        and accept the batch; ``None`` where the record exists (the producer wrote to the
        stream before, through this process or another) and must be read instead."""
        after_end = self._index.log_end_hint(stream_id)
        if producer_id not in self._handed_out or after_end is None:
            return None
        # No record, no batch of the producer: any log end seen so far is before all of them.
        return await self._take(stream_id, producer_id, None, after_end, epoch, first, last)

    async def _take(
        self,
        stream_id: int,
        producer_id: int,
        known: ProducerRecord | None,
        after_end: int,
        epoch: int,
        first: int,
        last: int,
    ) -> Claim | Duplicate | None:
        """Write the lease over the record ``known`` (``None``: there is none), only if the
        store still holds that version, and accept the batch; ``None`` if the record changed."""
        # A lease is only taken once its predecessor's has lapsed or was released: none of
        # its batches is still in flight.
        kept = [] if known is None or known.epoch != epoch else known.batches
        taken = ProducerRecord(
            epoch=epoch,
            batches=[b for b in kept if b.first_offset is not None],
            deadline_ms=int((time.time() + self._lease_s) * 1000),
            after_end=after_end,
            owner=self._id,
            version=known.version if known is not None else MUST_NOT_EXIST,
        )
        try:
            record = await self._metadata.put(
                keys.producer_state(stream_id, producer_id),
                taken.encode(),
                expected_version=taken.version,
            )
        except ConflictError:
            return None
        taken.version = record.version
        lease = _Lease(stream_id, producer_id, taken)
        self._leases[(stream_id, producer_id)] = lease
        self._start_upkeep()
        return self._accept(lease, epoch, first, last)

    def _held(self, state: ProducerRecord) -> bool:
        """Whether ``state``'s lease may still be used by its owner (this process included: a
        lease it dropped after a failed write must lapse like anyone's)."""
        if not state.owner and not state.pending:
            return False
        return time.time() * 1000 <= state.deadline_ms + self._lease_s * 1000

    async def _load(self, stream_id: int, producer_id: int) -> tuple[ProducerRecord | None, bool]:
        """The stored state, brought up to date with the index entries after ``after_end``, and
        whether its lease was held when it was read.

        Held or not is decided once, before the index is read, and the caller acts on that
        decision: a lease that lapsed while the index was read would otherwise leave a batch
        of its owner's that never landed among those "still in flight", and the state stored
        after it would wait for that batch forever.
        """
        record = await self._metadata.get(keys.producer_state(stream_id, producer_id))
        if record is None:
            return None, False
        state = ProducerRecord.decode(record.value, record.version)
        held = self._held(state)
        found: list[SequenceRange] = []
        async for entry in self._index.entries(stream_id, after_end=state.after_end):
            for p in entry.producers:
                if p.producer_id != producer_id or p.producer_epoch < state.epoch:
                    continue
                if p.producer_epoch > state.epoch:
                    state.epoch, state.batches, found = p.producer_epoch, [], []
                first_offset = entry.start + p.offset_delta
                found.append(
                    SequenceRange(p.first_sequence, p.last_sequence, p.record_count, first_offset)
                )
        written = {(b.first, b.last): b for b in state.batches if b.first_offset is not None}
        written.update({(b.first, b.last): b for b in found})
        resolved = sorted(written.values(), key=lambda b: b.first_offset or 0)
        # A batch accepted but not found is still in flight while the lease holds, and void once
        # it has lapsed: nothing of the owner's can be appended after that. One older than a
        # batch written after it is void too: an owner writes a producer's batches in order.
        unresolved = [b for b in state.pending if (b.first, b.last) not in written]
        if not held:
            unresolved = []
        elif resolved:
            unresolved = [b for b in unresolved if _follows(b.first, resolved[-1].last)]
        state.batches = resolved[-KEPT_BATCHES:] + unresolved
        return state, held

    # --- upkeep -----------------------------------------------------------------------------

    def _start_upkeep(self) -> None:
        if self._upkeep is None or self._upkeep.done():
            self._upkeep = asyncio.create_task(self._keep_leases(), name="producer-leases")

    async def _keep_leases(self) -> None:
        """Renew the leases of active producers and release those of idle ones."""
        tick = min(IDLE_RELEASE_S, self._lease_s) / 4
        while self._leases:
            await asyncio.sleep(tick)
            for key, lease in list(self._leases.items()):
                async with self._locks.hold(key):
                    if self._leases.get(key) is not lease:
                        continue
                    try:
                        await self._keep(lease)
                    except ConflictError:
                        self._leases.pop(key, None)  # it lapsed and was taken over
                    except IcefloeError as exc:
                        log.warning("could not renew producer %s's lease: %s", key[1], exc)
                        if time.time() > lease.deadline:
                            self._leases.pop(key, None)

    async def _keep(self, lease: _Lease) -> None:
        if not lease.in_flight and time.monotonic() - lease.last_used >= IDLE_RELEASE_S:
            await self._release(lease)
        elif lease.deadline - time.time() < self._lease_s / 2:
            await self._store(lease, owner=self._id, until=time.time() + self._lease_s)

    async def _release(self, lease: _Lease) -> None:
        await self._store(lease, owner="", until=time.time())
        key = (lease.stream_id, lease.producer_id)
        self._leases.pop(key, None)
        self._released[key] = lease.state
        while len(self._released) > RELEASED_KEPT:
            self._released.popitem(last=False)

    async def _store(self, lease: _Lease, owner: str, until: float) -> None:
        state = lease.state
        updated = ProducerRecord(
            epoch=state.epoch,
            batches=list(state.batches),
            deadline_ms=int(until * 1000),
            after_end=lease.after_end(self._index.log_end_hint(lease.stream_id)),
            owner=owner,
        )
        record = await self._metadata.put(
            keys.producer_state(lease.stream_id, lease.producer_id),
            updated.encode(),
            expected_version=state.version,
        )
        # Only now may appends rely on the new deadline: the store holds it. The batches stay
        # those in memory: a commit may have given one its offset while the put was on its way.
        state.version = record.version
        state.deadline_ms = updated.deadline_ms
        state.after_end = updated.after_end
        state.owner = owner


def _accepted(claim: Claim) -> tuple[int, int, int]:
    """How a lease knows a batch it accepted: (epoch, first sequence, last sequence)."""
    return claim.epoch, claim.sequences.first, claim.sequences.last


_PENDING_DUPLICATE: Final = object()


def _follows(first: int, last: int) -> bool:
    """Whether sequence ``first`` comes after ``last`` (sequences wrap around at 2**31)."""
    return 0 < (first - last) % SEQUENCE_MODULUS < SEQUENCE_MODULUS // 2


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
            raise SequenceGap(
                f"producer epoch {epoch} starts at sequence 0, but its batch at sequence "
                f"{first} came first; retry"
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
        if _follows(first, expected):
            raise SequenceGap(
                f"the batch at sequence {first} follows sequence {expected - 1}: the batches "
                "between are not written yet; retry"
            )
        if first != expected:
            raise ProducerError(
                ErrorCode.out_of_order_sequence_number,
                f"out of order sequence number: expected {expected}, got {first}",
            )
    return None
