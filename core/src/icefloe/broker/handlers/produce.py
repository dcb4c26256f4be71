"""Produce: validate each partition's batch, hand it to the stream writer, answer once durable.

A partition's batch is acknowledged only after its WAL object is durable and its index entry
is committed (the writer's future completes then), so acks=1 and acks=-1 mean the same here.
acks=0 gets no response, but the batch is written all the same.

Order matters for pipelining clients: an idempotent producer may have several requests in
flight on one connection, and their batches must reach the writer in request order or their
sequence numbers would look out of order. So a request takes its turn on each partition it
writes (:mod:`icefloe.broker.submit_order`) and submits the batch in that turn, and awaits the
commits only after its turns are over, so that the commits of pipelined requests overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import struct
import time
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe import metrics
from icefloe.broker.handlers import partitions
from icefloe.broker.protocol import make
from icefloe.broker.server import NO_RESPONSE, NoResponse, RequestContext
from icefloe.errors import IcefloeError, KafkaError
from icefloe.security.acls import Operation, ResourceType
from icefloe.storage import batch
from icefloe.storage.keyed import KeylessRecordsError
from icefloe.storage.writer import NotWritten, WriterClosed
from icefloe.topics import internal
from icefloe.topics.configs import (
    LOG_APPEND_TIME,
    TIMESTAMP_TYPE_CONFIG,
    batch_limit,
    is_compacted,
    stored_compression,
)

log = logging.getLogger(__name__)

_NO_THROTTLE = datetime.timedelta(0)
_VALID_ACKS: Final = (-1, 0, 1)
_LENGTH = struct.Struct(">i")
_TRANSACTIONAL_BIT: Final = 0x10
_PRODUCER_ID_AT: Final = 43
_PRODUCER: Final = struct.Struct(">qh")
"""A batch header's producer id and epoch."""
_SUBMITS_AT_ONCE: Final = 32
"""Partitions of one request submitted at the same time (each a task while it waits)."""
_UNKNOWN_LOG_START: Final = -1
"""The field's "unknown": the answer for a partition that does not exist. Otherwise the log
start comes from memory (:meth:`IndexReader.log_start_hint`): reading it from the store per
partition per request multiplied the acknowledgement latency of the latency profile."""


@dataclass(eq=False)
class _Partition:
    """One partition of the request and, as it goes, its outcome."""

    topic: str
    index: int
    stream_id: int | None = None
    pending: asyncio.Future[int] | None = None
    base_offset: int = -1
    log_start: int = _UNKNOWN_LOG_START
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    log_append_time_ms: int | None = None
    """The broker's time stamped on the batch (a LogAppendTime topic)."""
    size: int = 0
    """Bytes of the batch the producer sent."""
    record_errors: tuple[tuple[int, str], ...] = ()
    """(batch index, message) of the records that failed validation (keyless records of a
    compacted topic), for ProduceResponse v8+."""

    def fail(self, error: ErrorCode, message: str) -> None:
        self.error, self.message, self.pending = error, message, None

    def append_time(self) -> datetime.datetime | None:
        """The response's ``log_append_time``: ``None`` (-1) when the producer's timestamps
        stand (CreateTime) or the batch was refused."""
        if self.log_append_time_ms is None or self.error is not ErrorCode.none:
            return None
        return datetime.datetime.fromtimestamp(self.log_append_time_ms / 1000, datetime.UTC)


async def handle_produce(ctx: RequestContext, request: Any) -> Any | NoResponse:
    targets = await _submit_all(ctx, request)
    if request.acks == 0:
        return NO_RESPONSE
    # The commits go on without waiters: awaiting them one after the other answers as soon as
    # gathering them would, without a task per partition.
    for target in targets:
        await _committed(target)
    index = ctx.broker.storage.index
    unknown = []
    for target in targets:
        if target.stream_id is not None:
            start = index.cached_log_start(target.stream_id)
            if start is None:
                unknown.append(target)
            else:
                target.log_start = start
    if unknown:  # after a stream's first entries changed: read from the store together
        await asyncio.gather(*(_read_log_start(ctx, t) for t in unknown))
    return _response(ctx, request, targets)


async def _submit_all(ctx: RequestContext, request: Any) -> list[_Partition]:
    """Submit every partition's batch; refusals become partition errors.

    Each partition waits only for the connection's earlier requests that write it
    (:mod:`icefloe.broker.submit_order`), and the partitions go together: each may have to
    wait for the store (an idempotent producer's first batch on a partition claims its lease
    there), and one after the other those waits would add up. A partition named twice in one
    request keeps its batches in request order.
    """
    refusal = _refusal(ctx, request)
    targets = []
    by_partition: dict[tuple[str, int], list[tuple[_Partition, bytes]]] = {}
    for topic in request.topic_data:
        allowed = ctx.allows(Operation.WRITE, ResourceType.TOPIC, topic.name)
        for data in topic.partition_data:
            target = _Partition(topic.name, data.index)
            if refusal is not None:
                target.fail(*refusal)
            elif not allowed:
                target.fail(ErrorCode.topic_authorization_failed, _not_allowed(topic.name))
            else:
                key = (topic.name, data.index)
                by_partition.setdefault(key, []).append((target, data.records or b""))
            targets.append(target)
    # Before the first await: the connection starts its requests' handlers in request order.
    turns = ctx.connection.submit_order.take_turns(by_partition)

    async def submit_in_turn(partition: tuple[str, int]) -> None:
        async with turns[partition]:
            for target, records in by_partition[partition]:
                await _submit(ctx, target, records, request.transactional_id)

    waiting = iter(by_partition)

    async def submit_the_next() -> None:
        for partition in waiting:  # shared: each takes the next partition nobody has taken
            await submit_in_turn(partition)

    try:
        if len(by_partition) == 1:  # a request of one partition: no task to start
            await submit_the_next()
        elif by_partition:
            # Every submit ends before the request's turns do, even when one fails: a later
            # request must not overtake a batch still on its way.
            outcomes = await asyncio.gather(
                *(submit_the_next() for _ in range(min(len(by_partition), _SUBMITS_AT_ONCE))),
                return_exceptions=True,
            )
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
    finally:
        for turn in turns.values():  # those never held, if the request was cancelled
            turn.end()
    return targets


def _not_allowed(topic: str) -> str:
    return f"not allowed to write to topic {topic!r}"


def _refusal(ctx: RequestContext, request: Any) -> tuple[ErrorCode, str] | None:
    """An error for the whole request, as Kafka checks before looking at any partition."""
    if request.acks not in _VALID_ACKS:
        return ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, not {request.acks}"
    transactional_id = request.transactional_id
    if transactional_id is not None and not ctx.allows(
        Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id
    ):
        return (
            ErrorCode.transactional_id_authorization_failed,
            f"not allowed to write as transactional id {transactional_id!r}",
        )
    return None


async def _submit(
    ctx: RequestContext, target: _Partition, records: bytes, transactional_id: str | None
) -> None:
    target.stream_id = stream_id = await partitions.stream_of(ctx, target.topic, target.index)
    if stream_id is None:
        if internal.is_internal(target.topic):
            target.fail(*internal.append_refused())
        else:
            target.fail(
                ErrorCode.unknown_topic_or_partition,
                f"topic {target.topic!r} has no partition {target.index}",
            )
    elif partitions.owned_elsewhere(ctx, target.topic, target.index):
        target.fail(
            ErrorCode.not_leader_or_follower,
            f"partition {target.topic}-{target.index} is served by another broker of this zone",
        )
    elif not _single_batch(records):
        # Kafka 4 rule for produce v3+; the storage engine itself would take several.
        target.fail(
            ErrorCode.invalid_record,
            "produce requests must carry exactly one record batch per partition",
        )
    elif _is_transactional(records) and (
        refused := await _transaction_refusal(ctx, stream_id, transactional_id, records)
    ):
        target.fail(*refused)
    else:
        topic = ctx.broker.topics.get_cached(target.topic)  # cached by stream_of
        configs = topic.configs if topic else {}
        limit = batch_limit(configs, ctx.broker.config.storage)
        if configs.get(TIMESTAMP_TYPE_CONFIG) == LOG_APPEND_TIME:
            target.log_append_time_ms = int(time.time() * 1000)
        target.size = len(records)
        try:
            target.pending = await ctx.broker.storage.submit_batches(
                stream_id,
                records,
                max_batch_bytes=limit,
                compression=stored_compression(configs),
                log_append_time_ms=target.log_append_time_ms,
                keys_required_for=f"{target.topic}-{target.index}"
                if is_compacted(configs)
                else None,
            )
        except IcefloeError as exc:
            target.fail(*_write_error(exc))
            if isinstance(exc, KeylessRecordsError):
                target.record_errors = exc.record_errors


async def _committed(target: _Partition) -> None:
    """Wait for the partition's commit; a failure becomes the partition's error."""
    if target.pending is not None:
        try:
            target.base_offset = await target.pending
            metrics.BYTES_IN.labels(target.topic).inc(target.size)
        except IcefloeError as exc:
            target.fail(*_write_error(exc))


async def _read_log_start(ctx: RequestContext, target: _Partition) -> None:
    assert target.stream_id is not None
    # Informative only: the answer stands without it if the store cannot say.
    with contextlib.suppress(IcefloeError):
        target.log_start = await ctx.broker.storage.index.log_start_hint(target.stream_id)


def _response(ctx: RequestContext, request: Any, targets: list[_Partition]) -> Any:
    module = ctx.response_module()
    by_topic: dict[str, list[Any]] = {}
    for t in targets:
        by_topic.setdefault(t.topic, []).append(
            make(
                module.PartitionProduceResponse,
                index=t.index,
                error_code=t.error,
                base_offset=t.base_offset,
                log_append_time=t.append_time(),
                log_start_offset=t.log_start,
                record_errors=_record_errors(module, t.record_errors),
                error_message=t.message,
            )
        )
    return make(
        module.ProduceResponse,
        responses=tuple(
            make(module.TopicProduceResponse, name=name, partition_responses=tuple(answers))
            for name, answers in by_topic.items()
        ),
        throttle_time=_NO_THROTTLE,
    )


def _record_errors(module: Any, errors: tuple[tuple[int, str], ...]) -> tuple[Any, ...]:
    """The response's record errors (v8+; earlier versions have no such field)."""
    entity = getattr(module, "BatchIndexAndErrorMessage", None)
    if entity is None:
        return ()
    return tuple(
        make(entity, batch_index=i, batch_index_error_message=message) for i, message in errors
    )


def _write_error(exc: IcefloeError) -> tuple[ErrorCode, str]:
    """The partition error for a batch the writer refused or could not commit.

    Every error here is one clients retry with the same producer epoch and sequence: an
    idempotent producer that gets an error it cannot retry as it is (librdkafka's rule for any
    permanent error) bumps its epoch and renumbers every batch it has not had acknowledged, and
    one of those may already be written (see :mod:`icefloe.storage.producers`).
    """
    if isinstance(exc, KafkaError):
        return exc.error_code, str(exc)
    if isinstance(exc, WriterClosed):
        # Kafka's answer while a broker shuts down: the client asks where to go instead.
        return ErrorCode.not_leader_or_follower, str(exc)
    if isinstance(exc, NotWritten):
        # Retried by every client as "not written", which it surely is not.
        return ErrorCode.not_enough_replicas, f"the write failed: {exc}"
    if exc.retriable:
        # Every client retries REQUEST_TIMED_OUT, and it claims no more than we know: a
        # commit that failed half-way may or may not be visible (an idempotent retry is safe).
        return ErrorCode.request_timed_out, f"the write did not complete: {exc}; retry"
    log.error("produce failed", exc_info=exc)
    return ErrorCode.unknown_server_error, f"the write failed: {exc}"


def _single_batch(records: bytes) -> bool:
    """False when the data holds more than one batch; anything else is left to validation.

    Reads only the first batch's length: data that is shorter or truncated is one (bad)
    batch, which validation then reports with the exact error.
    """
    if len(records) < batch.LOG_OVERHEAD:
        return True
    length: int = _LENGTH.unpack_from(records, batch.LENGTH_AT)[0]
    return length + batch.LOG_OVERHEAD >= len(records)


def _is_transactional(records: bytes | None) -> bool:
    if records is None or len(records) <= batch.ATTRIBUTES_AT + 1:
        return False
    # Attributes are a big-endian int16: the transactional bit is in its low byte.
    return bool(records[batch.ATTRIBUTES_AT + 1] & _TRANSACTIONAL_BIT)


async def _transaction_refusal(
    ctx: RequestContext, stream_id: int, transactional_id: str | None, records: bytes
) -> tuple[ErrorCode, str] | None:
    """Why a transactional batch may not be written, if it may not: its producer must hold
    the partition in an ongoing transaction (AddPartitionsToTxn) at the transaction's epoch."""
    if len(records) < batch.HEADER_SIZE:
        return None  # validation reports the exact problem
    producer_id, epoch = _PRODUCER.unpack_from(records, _PRODUCER_ID_AT)
    try:
        return await _check_transaction(ctx, stream_id, transactional_id, producer_id, epoch)
    except IcefloeError as exc:  # the store could not say: the client retries
        return _write_error(exc)


async def _check_transaction(
    ctx: RequestContext,
    stream_id: int,
    transactional_id: str | None,
    producer_id: int,
    epoch: int,
) -> tuple[ErrorCode, str] | None:
    if transactional_id is None:
        return (
            ErrorCode.invalid_record,
            "transactional records need the producer's transactional id",
        )
    mark = await ctx.broker.storage.transactions.open_mark(stream_id, producer_id)
    if mark is None or mark.transactional_id != transactional_id:
        state = await ctx.broker.transactions.describe(transactional_id)
        if state is not None and state.producer_id == producer_id and state.epoch > epoch:
            # A zombie: its transactional id has moved on to a newer instance.
            return ErrorCode.invalid_producer_epoch, f"producer epoch {epoch} was fenced"
        return (
            ErrorCode.invalid_txn_state,
            f"producer {producer_id} has not added this partition to a transaction",
        )
    if epoch != mark.epoch:
        return (
            ErrorCode.invalid_producer_epoch,
            f"producer epoch {epoch} is not the transaction's epoch {mark.epoch}",
        )
    return None
