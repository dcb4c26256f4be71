"""Fetch: whole record batches from each partition, with long polls driven by notifications.

Size limits follow KIP-74: partitions are filled in request order until ``max_bytes``; only
the first partition that returns data may exceed a limit, by its first batch, so that a
consumer always makes progress; batches are never split. When fewer than ``min_bytes`` are
available the request waits, up to ``max_wait``, for an index notification on any of its
partitions (:meth:`StreamStorage.wait_for_data`), then reads on from where each partition
stopped. It does not wait when a partition has more data than its limit let in.

There are no fetch sessions (KIP-227): this broker answers as a Kafka broker whose session
cache has no slots. A full request gets a full response with session id 0, which tells the
client to send full requests again; an incremental request names a session this broker
never created, so it gets FETCH_SESSION_ID_NOT_FOUND, after which clients fall back to a
full request.

read_committed stops each partition at its last stable offset (the first offset of its oldest
open transaction) and answers the aborted transactions whose records the data holds, for the
consumer to skip; read_uncommitted reads everything (see docs/transactions.md).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe import metrics
from icefloe.broker.handlers import partitions
from icefloe.broker.memory import Held
from icefloe.broker.protocol import Buffer, RecordParts, make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError
from icefloe.security.acls import Operation, ResourceType
from icefloe.storage.engine import StreamStorage
from icefloe.storage.reader import OffsetOutOfRange, ReadResult, copy_small_views
from icefloe.storage.transactions import (
    TransactionalBatches,
    cut_before,
    transactional_producers,
)
from icefloe.topics import internal

_NO_THROTTLE = datetime.timedelta(0)
_READ_UNCOMMITTED: Final = 0
_LEAST_READ: Final = 64 << 10
"""A fetch's first read waits (within its max wait) until this much of the broker's memory
for client data is free, rather than read a sliver."""
_FULL_REQUEST_EPOCHS: Final = (0, -1)
"""Session epochs of full fetch requests (start a session, or none); others are incremental."""


@dataclass(eq=False)
class _Partition:
    """One requested partition: where to read, and what the latest read found."""

    topic: str
    index: int
    fetch_offset: int
    max_bytes: int
    stream_id: int | None = None
    error: ErrorCode = ErrorCode.none
    parts: list[Buffer] = field(default_factory=list)
    """The record batches read, in the buffers they were read into."""
    size: int = 0
    """Bytes in ``parts``."""
    next_offset: int = 0
    """Where the next read of this partition starts."""
    empty_log: bool = False
    """A partition of the internal topic: a log that never has a record."""
    held_back_to: int | None = None
    """For read_committed: where the records read end, when an open transaction's last stable
    offset held some of them back (only data past this may let the read go further)."""

    @property
    def readable(self) -> bool:
        return self.stream_id is not None and self.error is ErrorCode.none


async def handle_fetch(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    if getattr(request, "session_epoch", -1) not in _FULL_REQUEST_EPOCHS:
        return make(
            module.FetchResponse,
            throttle_time=_NO_THROTTLE,
            error_code=ErrorCode.fetch_session_id_not_found,
            session_id=0,
            responses=(),
        )
    targets = [
        await _target(ctx, topic.topic, p) for topic in request.topics for p in topic.partitions
    ]
    committed = request.isolation_level != _READ_UNCOMMITTED
    await _fill(ctx.broker.storage, ctx.held, targets, request, committed)
    # One response holds all its partitions' parts: a buffer they share counts once.
    copy_small_views([target.parts for target in targets])
    return make(
        module.FetchResponse,
        throttle_time=_NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=0,
        responses=await _responses(ctx, module, targets, request.isolation_level),
    )


async def _target(ctx: RequestContext, topic: str, request: Any) -> _Partition:
    """A partition to read, or the error that says why it cannot be read here."""
    target = _Partition(
        topic,
        request.partition,
        request.fetch_offset,
        request.partition_max_bytes,
        next_offset=request.fetch_offset,
    )
    if not ctx.allows(Operation.READ, ResourceType.TOPIC, topic):
        target.error = ErrorCode.topic_authorization_failed
        return target
    target.stream_id = await partitions.stream_of(ctx, topic, request.partition)
    target.empty_log = target.stream_id is None and internal.has_partition(topic, request.partition)
    epoch_error = partitions.leader_epoch_error(getattr(request, "current_leader_epoch", -1))
    if target.stream_id is None and not target.empty_log:
        target.error = ErrorCode.unknown_topic_or_partition
    elif epoch_error is not None:
        target.error = epoch_error
    elif partitions.owned_elsewhere(ctx, topic, request.partition):
        target.error = ErrorCode.not_leader_or_follower
    elif target.empty_log and target.fetch_offset != 0:
        target.error = ErrorCode.offset_out_of_range
    return target


async def _fill(
    storage: StreamStorage,
    held: Held,
    targets: list[_Partition],
    request: Any,
    committed: bool,
) -> None:
    """Read every partition; while fewer than ``min_bytes`` came back, wait and read on.

    A wait ends on an index notification for one of the partitions or at the deadline, and
    the next pass reads only what is new (from where each partition stopped), so a long poll
    never reads the same bytes twice.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.max_wait.total_seconds()
    size = 0
    while True:
        memory = _Memory(held, deadline - loop.time() if size == 0 else 0.0)
        size, full = await _read_more(storage, memory, targets, request.max_bytes, size, committed)
        remaining = deadline - loop.time()
        # As in Kafka, an error in any partition answers the request at once; so does a
        # response that is full, or a partition that has more to read than its limit let in
        # (a consumer behind the log end gets what is there, as Kafka answers at once for a
        # fetch from an older segment): waiting could not make the response any bigger.
        if (
            size >= request.min_bytes
            or full
            or remaining <= 0
            or any(t.error is not ErrorCode.none for t in targets)
        ):
            return
        waiting = [
            (t.stream_id, t.next_offset if t.held_back_to is None else t.held_back_to)
            for t in targets
            if t.stream_id is not None
        ]
        if not waiting:
            if any(t.empty_log for t in targets):
                # Only the internal topic's partitions, which never get data: wait as Kafka
                # waits on an empty log, rather than have the consumer ask again at once.
                await asyncio.sleep(remaining)
            return
        await storage.wait_for_data(waiting, remaining)


@dataclass
class _Memory:
    """The request's memory, and how long its first read may wait for some to be free."""

    held: Held
    wait_s: float

    async def grant(self, wanted: int) -> int:
        granted = await self.held.take_up_to(wanted, _LEAST_READ, self.wait_s)
        self.wait_s = 0.0  # once data is in the response, answer rather than wait for room
        return granted


async def _read_more(
    storage: StreamStorage,
    memory: _Memory,
    targets: list[_Partition],
    max_bytes: int,
    size: int,
    committed: bool,
) -> tuple[int, bool]:
    """Read each partition on from where it stopped, within the limits and the memory free.

    When the partitions' own limits fit in what is left of the request's, no partition's read
    depends on another's, and they are read at once: each costs a few store round trips.
    Otherwise they are read in turn, each within what the ones before it left.

    Args:
        size: Bytes the earlier passes read.
        committed: read_committed: stop at each partition's last stable offset.

    Returns:
        The bytes read in all, and whether the limits held back data that is there to read
        (the broker's memory is one of the limits).
    """
    wanted = [t for t in targets if t.readable and t.size < t.max_bytes]
    full = len(wanted) < sum(t.readable for t in targets)  # some partition is at its limit
    limits = [t.max_bytes - t.size for t in wanted]
    if len(wanted) > 1 and size + sum(limits) <= max_bytes:
        granted = await memory.grant(sum(limits))
        if granted == sum(limits):
            return await _read_at_once(storage, memory, wanted, limits, size, committed, full)
        memory.held.settle(granted, 0)  # too little memory free for all: read in turn
    return await _read_in_turn(storage, memory, wanted, max_bytes, size, committed, full)


async def _read_at_once(
    storage: StreamStorage,
    memory: _Memory,
    targets: list[_Partition],
    limits: list[int],
    size: int,
    committed: bool,
    full: bool,
) -> tuple[int, bool]:
    """:func:`_read_more` for partitions whose limits all fit, with their memory held."""
    reads = [
        _read_part(storage, target, limit, committed)
        for target, limit in zip(targets, limits, strict=True)
    ]
    results = await asyncio.gather(*reads)
    used = 0
    for target, limit, result in zip(targets, limits, results, strict=True):
        if result is None:
            continue
        # Decided in request order, as if read in turn: only the response's first data may
        # exceed its limit.
        if size == 0 or result.size <= limit:
            _append(target, result)
            size += result.size
            used += result.size
            full = full or result.truncated
        else:
            full = True
    memory.held.settle(sum(limits), used)
    return size, full


async def _read_in_turn(
    storage: StreamStorage,
    memory: _Memory,
    targets: list[_Partition],
    max_bytes: int,
    size: int,
    committed: bool,
    full: bool,
) -> tuple[int, bool]:
    """:func:`_read_more`, one partition after another."""
    for target in targets:
        if size >= max_bytes:
            full = True
            continue
        limit = min(target.max_bytes - target.size, max_bytes - size)
        granted = await memory.grant(limit)
        if granted == 0:
            full = True  # no memory free: answer with what there is; the client asks again
            continue
        limit = min(limit, granted)
        result = await _read_part(storage, target, limit, committed)
        # The storage returns a whole first batch; only the response's first data may exceed.
        kept = result is not None and (size == 0 or result.size <= limit)
        memory.held.settle(granted, result.size if result is not None and kept else 0)
        if result is None:
            continue
        if kept:
            _append(target, result)
            size += result.size
            full = full or result.truncated
        else:
            full = True
    return size, full


async def _read_part(
    storage: StreamStorage, target: _Partition, limit: int, committed: bool
) -> ReadResult | None:
    """What one partition adds: up to ``limit`` bytes, only committed data if asked."""
    result = await _read(storage, target, limit)
    if committed and result is not None:
        result = await _stable_part(storage, target, result)
    return result


def _append(target: _Partition, result: ReadResult) -> None:
    target.parts += result.parts
    target.size += result.size
    target.next_offset = result.next_offset


def _drop_data(target: _Partition) -> None:
    target.parts, target.size = [], 0


def _transactional_producers(parts: Sequence[Buffer]) -> set[int]:
    """Producers with transactional data in ``parts`` (each holds whole batches)."""
    return set().union(*map(transactional_producers, parts))


async def _stable_part(
    storage: StreamStorage, target: _Partition, result: ReadResult
) -> ReadResult | None:
    """What read_committed may see of ``result``: the batches before the last stable offset.
    Transactional data of a producer this broker knows no open transaction of is checked in
    the store first: the notification of its transaction may not have arrived yet."""
    assert target.stream_id is not None
    try:
        stable = await storage.transactions.confirm_stable_offset(
            target.stream_id, result.next_offset, _transactional_producers(result.parts)
        )
    except IcefloeError as exc:
        target.error = partitions.read_error(exc, f"fetch {target.topic}-{target.index}")
        _drop_data(target)
        return None
    if stable >= result.next_offset:
        target.held_back_to = None
        return result
    target.held_back_to = result.next_offset
    data = cut_before(result.data, stable)
    if not data:
        return None
    return ReadResult((data,), max(stable, target.next_offset))


async def _read(storage: StreamStorage, target: _Partition, max_bytes: int) -> ReadResult | None:
    assert target.stream_id is not None
    try:
        return await storage.read(target.stream_id, target.next_offset, max_bytes)
    except OffsetOutOfRange:
        target.error = ErrorCode.offset_out_of_range
    except IcefloeError as exc:
        target.error = partitions.read_error(exc, f"fetch {target.topic}-{target.index}")
    _drop_data(target)
    return None


async def _responses(
    ctx: RequestContext, module: Any, targets: list[_Partition], isolation_level: int
) -> tuple[Any, ...]:
    by_topic: dict[str, list[Any]] = {}
    for target in targets:
        by_topic.setdefault(target.topic, []).append(
            await _partition_response(ctx.broker.storage, module, target, isolation_level)
        )
    return tuple(
        make(module.FetchableTopicResponse, topic=topic, partitions=tuple(answers))
        for topic, answers in by_topic.items()
    )


async def _aborted(storage: StreamStorage, module: Any, target: _Partition) -> tuple[Any, ...]:
    """The aborted transactions whose records or markers the data holds, for the consumer to
    skip (:meth:`TransactionalBatches.hold`)."""
    batches = TransactionalBatches(target.parts)
    if not batches.producers or target.stream_id is None:
        return ()
    try:
        found = await storage.transactions.aborted(
            target.stream_id, target.fetch_offset, target.next_offset
        )
    except IcefloeError as exc:
        target.error = partitions.read_error(exc, f"fetch {target.topic}-{target.index}")
        _drop_data(target)
        return ()
    return tuple(
        make(module.AbortedTransaction, producer_id=a.producer_id, first_offset=a.first_offset)
        for a in found
        if batches.hold(a)
    )


async def _partition_response(
    storage: StreamStorage, module: Any, target: _Partition, isolation_level: int
) -> Any:
    high_watermark = log_start = -1  # what Kafka answers for a partition in error
    if target.empty_log and target.error is ErrorCode.none:
        high_watermark = log_start = 0
    if target.readable:
        assert target.stream_id is not None
        try:
            # As this broker last saw them: no store round trip per partition per fetch. The
            # high watermark is never below the end of the records returned.
            known_end = storage.index.log_end_hint(target.stream_id)
            if known_end is None:
                known_end = await storage.log_end(target.stream_id)
            high_watermark = max(known_end, target.next_offset)
            log_start = await storage.index.log_start_hint(target.stream_id)
        except IcefloeError as exc:
            target.error = partitions.read_error(exc, f"fetch {target.topic}-{target.index}")
            _drop_data(target)
            high_watermark = log_start = -1
    stable, aborted = high_watermark, None
    if target.readable:
        assert target.stream_id is not None
        stable = storage.transactions.stable_offset(target.stream_id, high_watermark)
    if isolation_level != _READ_UNCOMMITTED:
        # What was returned lies below the last stable offset (checked as it was read).
        stable = max(stable, target.next_offset) if target.size else stable
        aborted = await _aborted(storage, module, target)
    if target.size:
        metrics.BYTES_OUT.labels(target.topic).inc(target.size)
    return make(
        module.PartitionData,
        partition_index=target.index,
        error_code=target.error,
        high_watermark=high_watermark,
        last_stable_offset=stable,
        log_start_offset=log_start,
        # Kafka sends null for read_uncommitted and the list for read_committed.
        aborted_transactions=aborted,
        preferred_read_replica=-1,
        records=RecordParts.of(target.parts),
    )
