"""ListOffsets and OffsetForLeaderEpoch: offsets by position, by timestamp, by leader epoch.

Every partition is at leader epoch 0 forever (see :mod:`.partitions`), so a partition's epoch
history is one entry, "epoch 0 starts at offset 0", and answers come straight from the index.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers import partitions
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError
from icefloe.security.acls import Operation, ResourceType
from icefloe.storage.engine import StreamStorage
from icefloe.topics import internal

_NO_THROTTLE = datetime.timedelta(0)

LATEST: Final = -1
EARLIEST: Final = -2
MAX_TIMESTAMP: Final = -3
"""KIP-734 (v7+): the record with the largest timestamp."""
EARLIEST_LOCAL: Final = -4
"""KIP-1005 (v8+): the first offset on the broker's local disk; all of the log, here."""
READ_COMMITTED: Final = 1
UNKNOWN: Final = -1
"""Kafka's answer for "no such offset" and "no timestamp"."""


async def handle_list_offsets(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    topics = []
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED  # v2+
    for topic in request.topics:
        answers = [
            await _list_offset(ctx, module, topic.name, p, committed) for p in topic.partitions
        ]
        topics.append(
            make(module.ListOffsetsTopicResponse, name=topic.name, partitions=tuple(answers))
        )
    return make(module.ListOffsetsResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))


async def _list_offset(
    ctx: RequestContext, module: Any, topic: str, request: Any, committed: bool
) -> Any:
    def answer(error: ErrorCode, offset: int = UNKNOWN, timestamp: int = UNKNOWN) -> Any:
        return make(
            module.ListOffsetsPartitionResponse,
            partition_index=request.partition_index,
            error_code=error,
            timestamp=timestamp,
            offset=offset,
            leader_epoch=partitions.LEADER_EPOCH if offset != UNKNOWN else -1,
        )

    if not ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, topic):
        return answer(ErrorCode.topic_authorization_failed)
    stream_id = await partitions.stream_of(ctx, topic, request.partition_index)
    empty = stream_id is None and internal.has_partition(topic, request.partition_index)
    if stream_id is None and not empty:
        return answer(ErrorCode.unknown_topic_or_partition)
    epoch_error = partitions.leader_epoch_error(getattr(request, "current_leader_epoch", -1))
    if epoch_error is not None:
        return answer(epoch_error)
    if stream_id is None:  # the internal topic: an empty log
        return answer(ErrorCode.none, *_empty_log_offset(request.timestamp))
    try:
        offset, timestamp = await _find_offset(ctx.broker.storage, stream_id, request.timestamp)
        if request.timestamp == LATEST and committed:
            # read_committed consumers start at the last stable offset, not past open
            # transactions' records.
            stable = await ctx.broker.storage.transactions.confirm_stable_offset(
                stream_id, offset, ()
            )
            offset = min(offset, stable)
    except IcefloeError as exc:
        return answer(partitions.read_error(exc, f"list offsets {topic}-{request.partition_index}"))
    return answer(ErrorCode.none, offset, timestamp)


async def _find_offset(storage: StreamStorage, stream_id: int, timestamp: int) -> tuple[int, int]:
    """The (offset, timestamp) that ListOffsets answers for a target ``timestamp``.

    The special targets answer with timestamp -1, except MAX_TIMESTAMP, which answers with
    the largest timestamp itself. A real timestamp answers with the first record whose
    timestamp is at or after it, and that record's timestamp; (-1, -1) when there is none.
    """
    if timestamp == LATEST:
        return await storage.log_end(stream_id), UNKNOWN
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return await storage.log_start(stream_id), UNKNOWN
    if timestamp == MAX_TIMESTAMP:
        return await _max_timestamp(storage, stream_id)
    # Other negative targets fall through, as in Kafka: every record is at or after them.
    offset = await storage.offset_for_timestamp(stream_id, timestamp)
    if offset is None:
        return UNKNOWN, UNKNOWN
    return offset, await _timestamp_at(storage, stream_id, offset)


def _empty_log_offset(timestamp: int) -> tuple[int, int]:
    """What :func:`_find_offset` answers for a log that never had a record."""
    if timestamp in (LATEST, EARLIEST, EARLIEST_LOCAL):
        return 0, UNKNOWN
    return UNKNOWN, UNKNOWN


async def _max_timestamp(storage: StreamStorage, stream_id: int) -> tuple[int, int]:
    """The first record holding the stream's largest timestamp.

    Costs two paged scans over the stream's whole index (index entries carry their largest
    timestamp, so the scans read no record data) and the decoding of the one batch that
    holds the record. Fine for an occasional admin query; it is not cached.
    """
    log_start = await storage.index.recorded_log_start(stream_id)
    timestamps = [
        entry.max_timestamp async for entry in storage.index.entries(stream_id, log_start)
    ]
    if not timestamps:
        return UNKNOWN, UNKNOWN
    newest = max(timestamps)
    # No record is later than ``newest``, so the first at-or-after it is the first with it.
    offset = await storage.offset_for_timestamp(stream_id, newest)
    return (UNKNOWN, UNKNOWN) if offset is None else (offset, newest)


async def _timestamp_at(storage: StreamStorage, stream_id: int, offset: int) -> int:
    records = await storage.read_records(stream_id, offset, max_bytes=1)
    return records[0].timestamp if records else UNKNOWN


async def handle_offset_for_leader_epoch(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    topics = []
    for topic in request.topics:
        answers = [await _epoch_end(ctx, module, topic.topic, p) for p in topic.partitions]
        topics.append(
            make(module.OffsetForLeaderTopicResult, topic=topic.topic, partitions=tuple(answers))
        )
    return make(
        module.OffsetForLeaderEpochResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics)
    )


async def _epoch_end(ctx: RequestContext, module: Any, topic: str, request: Any) -> Any:
    """Where ``request.leader_epoch`` ends, as a Kafka log with the single epoch 0 answers.

    Epoch 0 is the current epoch, so it ends at the log end. Kafka answers any later epoch,
    and the "undefined" epoch -1, with epoch -1 and offset -1.
    """

    def answer(error: ErrorCode, epoch: int = -1, end_offset: int = UNKNOWN) -> Any:
        return make(
            module.EpochEndOffset,
            error_code=error,
            partition=request.partition,
            leader_epoch=epoch,
            end_offset=end_offset,
        )

    if not ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, topic):
        return answer(ErrorCode.topic_authorization_failed)
    stream_id = await partitions.stream_of(ctx, topic, request.partition)
    empty = stream_id is None and internal.has_partition(topic, request.partition)
    if stream_id is None and not empty:
        return answer(ErrorCode.unknown_topic_or_partition)
    epoch_error = partitions.leader_epoch_error(request.current_leader_epoch)
    if epoch_error is not None:
        return answer(epoch_error)
    if request.leader_epoch != partitions.LEADER_EPOCH:
        return answer(ErrorCode.none)
    if stream_id is None:  # the internal topic: an empty log ends at 0
        return answer(ErrorCode.none, partitions.LEADER_EPOCH, 0)
    try:
        log_end = await ctx.broker.storage.log_end(stream_id)
    except IcefloeError as exc:
        return answer(partitions.read_error(exc, f"offset for epoch {topic}-{request.partition}"))
    return answer(ErrorCode.none, partitions.LEADER_EPOCH, log_end)
