"""The write path: buffer appends from every stream, seal one WAL object, commit, acknowledge.

One :class:`WalWriter` per process buffers the appends of all streams. A flush (by size or by
time, whichever comes first) seals the buffered batches into one WAL object, chunked by stream.
Once the WAL append is durable, each chunk gets one index entry by sequenced append; only then
are the waiting appends completed with their base offsets. Commits happen in flush order, so
offsets follow the order in which appends were accepted.

Bytes accepted but not yet committed are bounded by ``max_buffered_bytes``; past it, appends
wait (back-pressure), so a slow WAL or metadata store never turns into unbounded memory.

While all ``max_inflight_flushes`` flushes are under way, a full buffer is not sealed at once
but goes on filling until one of them ends (up to ``GROUPED_FLUSHES`` times the flush size):
under load the WAL objects grow, and with them what each WAL append, fsync and index commit
carries, instead of queueing more small objects behind the busy ones. The wait is the one a
sealed object would have spent queued.

A writer that seals when idle (the ``latency`` profile) does not wait for the flush interval
while no flush is under way: the buffer is sealed once the event loop has taken in what
arrived with the append, and when a flush ends with nothing else under way, what buffered
meanwhile is sealed at once. At low rates an append then waits for no timer; under load
flushes overlap and the buffer fills by size and interval as before (group commit).

A writer with a quiet period (the ``cost`` profile) also seals once no append has arrived for
that long: a producer that has sent all the requests it may have in flight (five for Kafka's
Java client) waits for their answers, and the rest of the interval would only delay them. A
steady stream of appends leaves no such gap, and its objects fill to size or interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from icefloe import metrics
from icefloe.config.storage import StorageOptions
from icefloe.errors import IcefloeError, UnavailableError
from icefloe.ports.wal import WAL
from icefloe.storage import walformat
from icefloe.storage.index import BatchRef, IndexEntry, ProducerBatch, WalLocation
from icefloe.storage.locks import KeyedLocks
from icefloe.storage.offset_index import NewEntry, OffsetIndex
from icefloe.storage.producers import Claim, Duplicate, ProducerStates
from icefloe.storage.recent import RecentWalObjects

log = logging.getLogger(__name__)

GROUPED_FLUSHES = 8
"""A WAL object sealed while flushes are busy holds at most this many flush sizes."""


class NotWritten(UnavailableError):
    """The append failed and is surely not in the stream: its WAL object was not written, or
    the writer decided not to commit it. A retry cannot duplicate it."""


class CommitDeadlineExceeded(NotWritten):
    """The WAL object or producer claim got too old to be committed; the append failed."""


class WriterClosed(NotWritten):
    """The process is stopping: the append was refused, another broker takes it."""


class FollowsFailedBatch(NotWritten):
    """An idempotent producer's batch accepted after one of its batches whose write failed:
    written alone, it would leave a gap in the producer's sequence."""


@dataclass(frozen=True, slots=True)
class ValidBatch:
    """A validated Kafka record batch and the header facts the writer needs."""

    data: memoryview
    record_count: int
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(eq=False)
class _Append:
    stream_id: int
    batches: Sequence[ValidBatch]
    claim: Claim | None
    future: asyncio.Future[int]
    record_count: int = 0
    size: int = 0

    def __post_init__(self) -> None:
        self.record_count = sum(b.record_count for b in self.batches)
        self.size = sum(b.size for b in self.batches)


@dataclass(eq=False)
class _Flush:
    appends: list[_Append] = field(default_factory=list)
    size: int = 0


class WalWriter:
    """Buffers appends of every stream and commits them through the WAL and the index."""

    def __init__(
        self,
        wal: WAL,
        offsets: OffsetIndex,
        options: StorageOptions,
        recent: RecentWalObjects,
        producers: ProducerStates,
    ) -> None:
        self._wal = wal
        self._producers = producers
        self._ordering = KeyedLocks()
        self._offsets = offsets
        self._options = options
        self._recent = recent
        self.profile = options.flush_profile(wal.billed_per_append)
        self._flush_bytes = options.flush_bytes_for(self.profile)
        self._interval = options.flush_interval_for(self.profile)
        self._seal_when_idle = options.seal_when_idle_for(self.profile)
        self._quiet = options.flush_quiet_for(self.profile)
        self._quiet_timer: asyncio.TimerHandle | None = None
        self._last_append = 0.0
        self._busy_limit = GROUPED_FLUSHES * self._flush_bytes
        self._buffer = _Flush()
        self._timer: asyncio.TimerHandle | None = None
        self._outstanding = 0  # bytes accepted and not yet completed
        self._space = asyncio.Condition()
        self._inflight = asyncio.Semaphore(options.max_inflight_flushes)
        self._unfinished = 0  # flushes sealed and not yet committed or failed
        self._previous_commit: asyncio.Future[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._sealing_wanted = False
        """A full or timed-out buffer waits for a flush slot (see the module docstring)."""
        self._closed = False

    async def append(self, stream_id: int, batches: Sequence[ValidBatch]) -> int:
        """Append validated batches to a stream; return the first offset once committed.

        Equivalent to awaiting the future that :meth:`submit` returns.
        """
        return await (await self.submit(stream_id, batches))

    async def submit(self, stream_id: int, batches: Sequence[ValidBatch]) -> asyncio.Future[int]:
        """Buffer validated batches for a stream; the future gives the first offset once committed.

        Returns as soon as the batches hold their place in the buffer, so a caller that must
        keep several appends in order (a Kafka connection pipelining produce requests) submits
        them one after the other and awaits the futures together. Appends to one stream are
        committed in the order of the calls. A batch from an
        idempotent producer (it must then be the only batch) is checked against the producer's
        sequence state first; a retried batch returns its original offset without being
        written again. Waits while ``max_buffered_bytes`` of uncommitted data are held.

        Raises:
            ProducerError: the Kafka sequence rules reject the batch.
            ClaimPending: the same batch is being written by another process (retriable).
            UnavailableError: the WAL or the metadata store failed (retriable).
        """
        if self._closed:
            raise WriterClosed("this broker is stopping; retry on another")
        idempotent = [b for b in batches if b.producer_id >= 0 and b.base_sequence >= 0]
        if idempotent and len(batches) != 1:
            raise ValueError("an idempotent producer's append must hold exactly one batch")
        async with self._ordering.hold(stream_id):  # FIFO: call order is buffer order
            claim = None
            if idempotent:
                batch = idempotent[0]
                outcome = await self._producers.claim(
                    stream_id,
                    batch.producer_id,
                    batch.producer_epoch,
                    batch.base_sequence,
                    batch.base_sequence + batch.record_count - 1,
                )
                if isinstance(outcome, Duplicate):
                    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                    done.set_result(outcome.first_offset)
                    return done
                claim = outcome
            future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            pending = _Append(stream_id, batches, claim, future)
            await self._reserve(pending.size)
            self._buffer.appends.append(pending)
            self._buffer.size += pending.size
            loop = asyncio.get_running_loop()
            self._last_append = loop.time()
            if self._buffer.size >= self._flush_bytes:
                self._start_flush(self._busy_limit)
                return future
            if self._timer is None:
                # A delay of 0 still runs after the loop's next poll, so the other partitions
                # of a request, and requests that arrived together, join the same object.
                delay = 0.0 if self._idle else self._interval
                self._timer = loop.call_later(delay, self._start_flush, self._busy_limit)
            if self._quiet is not None and self._quiet_timer is None:
                self._quiet_timer = loop.call_later(self._quiet, self._seal_if_quiet)
        return future

    async def flush(self) -> None:
        """Seal what is buffered now and wait until every flush so far has committed."""
        self._start_flush()
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Flush and commit everything buffered, then refuse further appends."""
        self._closed = True
        await self.flush()

    # --- buffering --------------------------------------------------------------------------

    @property
    def _idle(self) -> bool:
        """Whether a buffered append should be sealed without waiting for the interval."""
        return self._seal_when_idle and self._unfinished == 0

    def _seal_if_quiet(self) -> None:
        """Seal the buffer if no append came for the quiet period; else look again when it
        will have passed since the last one."""
        self._quiet_timer = None
        if not self._buffer.appends or self._quiet is None:
            return
        loop = asyncio.get_running_loop()
        waited = loop.time() - self._last_append
        if waited >= self._quiet:
            self._start_flush(self._busy_limit)
        else:
            self._quiet_timer = loop.call_later(self._quiet - waited, self._seal_if_quiet)

    async def _reserve(self, size: int) -> None:
        if self._has_room_for(size):  # the common case, without taking the condition's lock
            self._outstanding += size
            return
        async with self._space:
            # An append larger than the whole budget still goes through when nothing else is
            # outstanding; otherwise it could never be written.
            await self._space.wait_for(lambda: self._has_room_for(size))
            self._outstanding += size

    def _has_room_for(self, size: int) -> bool:
        return (
            self._outstanding == 0 or self._outstanding + size <= self._options.max_buffered_bytes
        )

    async def _release(self, size: int) -> None:
        async with self._space:
            self._outstanding -= size
            self._space.notify_all()

    def _start_flush(self, busy_limit: int = 0) -> None:
        """Seal the buffer and start its flush; while every flush slot is busy and the buffer
        holds less than ``busy_limit`` bytes, leave it to fill until a flush ends."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer.appends:
            return
        busy = self._unfinished >= self._options.max_inflight_flushes
        if busy and self._buffer.size < busy_limit:
            self._sealing_wanted = True
            return
        self._sealing_wanted = False
        self._unfinished += 1
        flush, self._buffer = self._buffer, _Flush()
        loop = asyncio.get_running_loop()
        previous = self._previous_commit
        committed: asyncio.Future[None] = loop.create_future()
        self._previous_commit = committed
        task = asyncio.create_task(self._run(flush, previous, committed), name="wal-flush")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- flushing ---------------------------------------------------------------------------

    async def _run(
        self,
        flush: _Flush,
        previous: asyncio.Future[None] | None,
        committed: asyncio.Future[None],
    ) -> None:
        try:
            async with self._inflight:
                await self._write_and_commit(flush, previous)
        finally:
            self._unfinished -= 1
            committed.set_result(None)
            await self._release(flush.size)
            if self._sealing_wanted or self._idle:
                self._start_flush()  # what buffered while the flushes were under way

    async def _write_and_commit(self, flush: _Flush, previous: asyncio.Future[None] | None) -> None:
        started = time.perf_counter()
        try:
            sealed = await self._write(flush)
        except Exception as exc:  # noqa: BLE001 - every failure must reach the appends
            sealed = None
            metrics.WAL_FLUSH_FAILURES.inc()
            self._fail(flush.appends, NotWritten(f"the WAL write failed: {exc}"), cause=exc)
        # Commits go in flush order even when WAL writes finish out of order.
        if previous is not None:
            await asyncio.shield(previous)
        if sealed is not None and await self._commit(sealed):
            metrics.WAL_FLUSH_SECONDS.observe(time.perf_counter() - started)
            metrics.WAL_RECORDS.inc(sum(p.record_count for p in flush.appends))

    async def _write(self, flush: _Flush) -> _Sealed:
        by_stream: dict[int, list[_Append]] = {}
        for pending in flush.appends:
            by_stream.setdefault(pending.stream_id, []).append(pending)
        chunks = [
            walformat.ChunkInput(
                stream_id=stream_id,
                batches=[b.data for p in appends for b in p.batches],
            )
            for stream_id, appends in sorted(by_stream.items())
        ]
        created = time.time()
        # On the event loop: it walks the batches' headers only. A WAL whose recent objects
        # reads find in the page cache gets the batches (views into request buffers) as they
        # are; the others get them joined, one copy that also serves tail reads from memory.
        encoded = walformat.encode_wal_object(chunks, created_ms=int(created * 1000))
        if self._wal.reads_from_page_cache:
            ref = await self._wal.append_parts(encoded.parts)
        else:
            ref = await self._wal.append(encoded.data)
            self._recent.add(ref, encoded.data)
        metrics.WAL_FLUSH_BYTES.observe(encoded.size)
        return _Sealed(ref, created, by_stream, encoded.chunks)

    async def _commit(self, sealed: _Sealed) -> bool:
        """Commit each stream's index entry and answer its appends; whether all committed."""
        now = time.time()
        results: dict[int, IndexEntry | BaseException] = {}  # by stream: one chunk each
        due = []
        for placement in sealed.placements:
            stream_id = placement.entry.stream_id
            refusal = self._refusal(sealed, sealed.by_stream[stream_id], now)
            if refusal is not None:
                results[stream_id] = refusal
            else:
                due.append(self._new_entry(sealed, placement, now))
        appended: list[IndexEntry | BaseException]
        try:
            appended = await self._offsets.append(due)
        except Exception as exc:  # noqa: BLE001 - the store refused them all (it closed)
            appended = [exc] * len(due)
        results.update(zip((chunk.stream_id for chunk in due), appended, strict=True))
        failed = False
        for placement in sealed.placements:
            result = results[placement.entry.stream_id]
            appends = sealed.by_stream[placement.entry.stream_id]
            if isinstance(result, BaseException):
                failed = True
                self._fail(appends, result)
                continue
            offset = result.start
            for pending in appends:
                if pending.claim is not None:
                    self._producers.committed(pending.claim, offset)
                if not pending.future.done():
                    pending.future.set_result(offset)
                offset += pending.record_count
        if failed:
            metrics.WAL_FLUSH_FAILURES.inc()
        return not failed

    def _refusal(self, sealed: _Sealed, appends: list[_Append], now: float) -> NotWritten | None:
        """Why the chunk may not be committed, if it may not: the object waited too long, an
        idempotent batch's producer lease may have passed to another process, or the batch
        follows one of its producer's that failed."""
        if now - sealed.created > self._options.commit_deadline_s:
            return CommitDeadlineExceeded(
                f"WAL object {sealed.ref} was not committed within "
                f"{self._options.commit_deadline_s}s (storage.commit_deadline_s); retry"
            )
        for pending in appends:
            claim = pending.claim
            if claim is not None and not self._producers.may_append(claim, now):
                if claim.lease.void:
                    return FollowsFailedBatch(
                        f"producer {claim.producer_id}'s batch at sequence "
                        f"{claim.sequences.first} follows one of its batches that failed; retry"
                    )
                return CommitDeadlineExceeded(
                    f"producer {claim.producer_id}'s lease ended before its batch at sequence "
                    f"{claim.sequences.first} was committed; retry"
                )
        return None

    @staticmethod
    def _new_entry(sealed: _Sealed, chunk: walformat.EncodedChunk, now: float) -> NewEntry:
        placement = chunk.entry
        return NewEntry(
            stream_id=placement.stream_id,
            record_count=placement.record_count,
            size=placement.length,
            location=WalLocation(sealed.ref, placement.position, placement.length),
            min_timestamp=placement.min_timestamp,
            max_timestamp=placement.max_timestamp,
            created_ms=int(now * 1000),
            batches=tuple(
                BatchRef(b.offset_delta, b.position, b.length, b.record_count, b.max_timestamp)
                for b in chunk.batches
            ),
            producers=_producer_batches(sealed.by_stream[placement.stream_id]),
        )

    def _fail(
        self, appends: Sequence[_Append], exc: BaseException, cause: BaseException | None = None
    ) -> None:
        """Fail ``appends`` with ``exc``: a :class:`NotWritten` where they are surely not in
        the stream, anything else where they may be (an index commit that failed half-way)."""
        if not isinstance(cause or exc, IcefloeError):
            log.error("stream write failed", exc_info=cause or exc)
        if not isinstance(exc, IcefloeError):
            exc = UnavailableError(f"stream write failed: {exc}")
        maybe_written = not isinstance(exc, NotWritten)
        for pending in appends:
            if pending.claim is not None:
                self._producers.failed(pending.claim, maybe_written=maybe_written)
            if not pending.future.done():
                pending.future.set_exception(exc)
            with contextlib.suppress(asyncio.InvalidStateError):
                pending.future.exception()  # marks it retrieved if nobody awaits it any more


@dataclass(frozen=True, slots=True)
class _Sealed:
    ref: str
    created: float
    by_stream: dict[int, list[_Append]]
    placements: tuple[walformat.EncodedChunk, ...]


def _producer_batches(appends: list[_Append]) -> tuple[ProducerBatch, ...]:
    """The idempotent-producer batches of a chunk, with their offset deltas within it."""
    producers = []
    delta = 0
    for pending in appends:
        for batch in pending.batches:
            if batch.producer_id >= 0 and batch.base_sequence >= 0:
                producers.append(
                    ProducerBatch(
                        batch.producer_id,
                        batch.producer_epoch,
                        batch.base_sequence,
                        batch.base_sequence + batch.record_count - 1,
                        delta,
                        batch.record_count,
                    )
                )
            delta += batch.record_count
    return tuple(producers)
