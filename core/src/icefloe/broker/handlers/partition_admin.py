"""DeleteRecords, DescribeProducers and DescribeLogDirs: the admin APIs about partitions' data.

- **DeleteRecords** moves a partition's log start (:meth:`StreamStorage.delete_records`): -1
  means the high watermark, an offset past it or below -1 is OFFSET_OUT_OF_RANGE, and a topic
  whose ``cleanup.policy`` does not include ``delete`` refuses with POLICY_VIOLATION, as
  Kafka's does. Any broker can do it; it is one compare-and-set in the metadata store.
- **DescribeProducers** lists each partition's idempotent producers from the state storage
  keeps for them, with the start offset of each one's open transaction (a bound: the log end
  when the partition joined it).
- **DescribeLogDirs** reports one log directory, the object store that holds the data, with
  each partition this broker leads in Metadata (for the client's zone), so that the partitions
  of a cluster add up once over its brokers: its size is the bytes the offset index references
  (WAL chunks and Parquet files), its offset lag 0, and it is never a future log. The volume's
  total and usable bytes are unknown (-1), as for remote storage.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers import partitions
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.cluster import client_zone
from icefloe.errors import IcefloeError
from icefloe.security.acls import Operation, ResourceType
from icefloe.storage.reader import OffsetOutOfRange
from icefloe.topics import internal
from icefloe.topics.configs import effective_value, split_list
from icefloe.topics.registry import Topic

_NO_THROTTLE = datetime.timedelta(0)
_UNKNOWN: Final = -1
MAX_DESCRIBED_PRODUCERS: Final = 1000
"""Producers listed per partition at most (Kafka lists all; this bounds the answer)."""


# --- DeleteRecords ---------------------------------------------------------------------------


async def handle_delete_records(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    done: dict[tuple[str, int], tuple[ErrorCode, int]] = {}
    topics = []
    for topic in request.topics:
        answers = []
        for p in topic.partitions:
            key = (topic.name, int(p.partition_index))
            if key not in done:  # a partition named twice is deleted from once
                done[key] = await _delete_records(ctx, topic.name, key[1], int(p.offset))
            error, low_watermark = done[key]
            answers.append(
                make(
                    module.DeleteRecordsPartitionResult,
                    partition_index=p.partition_index,
                    low_watermark=low_watermark,
                    error_code=error,
                )
            )
        topics.append(
            make(module.DeleteRecordsTopicResult, name=topic.name, partitions=tuple(answers))
        )
    return make(module.DeleteRecordsResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))


async def _delete_records(
    ctx: RequestContext, topic_name: str, partition: int, offset: int
) -> tuple[ErrorCode, int]:
    """(error, low watermark) of one partition's deletion."""
    if not ctx.allows(Operation.DELETE, ResourceType.TOPIC, topic_name):
        return ErrorCode.topic_authorization_failed, _UNKNOWN
    topic = await ctx.broker.topics.get(topic_name)
    if topic is None and internal.is_internal(topic_name):
        return internal.delete_records_refused()[0], _UNKNOWN
    if topic is None or not 0 <= partition < topic.partitions:
        return ErrorCode.unknown_topic_or_partition, _UNKNOWN
    policy = effective_value(topic.configs, "cleanup.policy", ctx.broker.config.storage)
    if "delete" not in split_list(policy):
        return ErrorCode.policy_violation, _UNKNOWN
    storage = ctx.broker.storage
    try:
        return ErrorCode.none, await storage.delete_records(topic.streams[partition], offset)
    except OffsetOutOfRange:
        return ErrorCode.offset_out_of_range, _UNKNOWN
    except IcefloeError as exc:
        return partitions.read_error(exc, f"delete records {topic_name}-{partition}"), _UNKNOWN


# --- DescribeProducers -----------------------------------------------------------------------


async def handle_describe_producers(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    topics = []
    for topic in request.topics:
        allowed = ctx.allows(Operation.READ, ResourceType.TOPIC, topic.name)
        found = await ctx.broker.topics.get(topic.name) if allowed else None
        answers = []
        for index in dict.fromkeys(int(i) for i in topic.partition_indexes):
            if allowed:
                answers.append(await _producers(ctx, module, found, topic.name, index))
            else:
                answers.append(_producers_refused(module, topic.name, index))
        topics.append(make(module.TopicResponse, name=topic.name, partitions=tuple(answers)))
    return make(module.DescribeProducersResponse, throttle_time=_NO_THROTTLE, topics=tuple(topics))


def _producers_refused(module: Any, name: str, index: int) -> Any:
    return make(
        module.PartitionResponse,
        partition_index=index,
        error_code=ErrorCode.topic_authorization_failed,
        error_message=f"not allowed to read topic {name!r}",
        active_producers=(),
    )


async def _producers(
    ctx: RequestContext, module: Any, topic: Topic | None, name: str, index: int
) -> Any:
    def answer(error: ErrorCode, message: str | None = None, active: tuple[Any, ...] = ()) -> Any:
        return make(
            module.PartitionResponse,
            partition_index=index,
            error_code=error,
            error_message=message,
            active_producers=active,
        )

    if topic is None or not 0 <= index < topic.partitions:
        return answer(ErrorCode.unknown_topic_or_partition, "this partition does not exist")
    producers = ctx.broker.storage.producers
    try:
        found = await producers.describe(topic.streams[index], MAX_DESCRIBED_PRODUCERS)
        marks = await ctx.broker.storage.transactions.stored_open_marks(topic.streams[index])
    except IcefloeError as exc:
        return answer(partitions.read_error(exc, f"describe producers {name}-{index}"))
    open_since = {m.producer_id: m.first_offset for m in marks}
    return answer(
        ErrorCode.none,
        active=tuple(
            make(
                module.ProducerState,
                producer_id=p.producer_id,
                producer_epoch=p.epoch,
                last_sequence=p.last_sequence,
                last_timestamp=_UNKNOWN,
                coordinator_epoch=_UNKNOWN,
                current_txn_start_offset=open_since.get(p.producer_id, _UNKNOWN),
            )
            for p in found
        ),
    )


# --- DescribeLogDirs -------------------------------------------------------------------------


async def handle_describe_log_dirs(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    broker = ctx.broker
    if not ctx.allows(Operation.DESCRIBE, ResourceType.CLUSTER):
        return make(
            module.DescribeLogDirsResponse,
            throttle_time=_NO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            results=(),
        )
    wanted: list[tuple[Topic, Sequence[int]]] = []
    if request.topics is None:
        wanted = [(t, range(t.partitions)) for t in broker.topics.cached()]
    else:
        for asked in {t.topic: t for t in request.topics}.values():
            topic = await broker.topics.get(asked.topic)
            if topic is not None:
                unique = dict.fromkeys(int(i) for i in asked.partitions)
                wanted.append((topic, [i for i in unique if 0 <= i < topic.partitions]))
    zone = client_zone(ctx.client_id)
    error = ErrorCode.none
    topics = []
    for topic, indexes in wanted:
        answers = []
        owners = broker.cluster.owners(topic.name, topic.partitions, zone)
        for index in indexes:
            if owners[index].node_id != broker.me.node_id:
                continue  # another broker reports it, as its leader in Metadata
            try:
                size = await _partition_size(ctx, topic.streams[index])
            except IcefloeError as exc:
                error = partitions.read_error(exc, f"describe log dirs {topic.name}-{index}")
                break
            answers.append(
                make(
                    module.DescribeLogDirsPartition,
                    partition_index=index,
                    partition_size=size,
                    offset_lag=0,
                    is_future_key=False,
                )
            )
        if answers:
            topics.append(
                make(module.DescribeLogDirsTopic, name=topic.name, partitions=tuple(answers))
            )
    result = make(
        module.DescribeLogDirsResult,
        error_code=error,
        log_dir=log_dir(ctx),
        topics=tuple(topics) if error == ErrorCode.none else (),
        total_bytes=_UNKNOWN,
        usable_bytes=_UNKNOWN,
    )
    return make(
        module.DescribeLogDirsResponse,
        throttle_time=_NO_THROTTLE,
        error_code=ErrorCode.none,
        results=(result,),
    )


def log_dir(ctx: RequestContext) -> str:
    """The one log directory: where the object store keeps the data."""
    return ctx.broker.storage.object_store.url("")


async def _partition_size(ctx: RequestContext, stream_id: int) -> int:
    """The bytes of the stream's index entries: WAL chunks and Parquet files."""
    return sum([entry.size async for entry in ctx.broker.storage.index.entries(stream_id)])
