"""Metadata: live brokers of the client's zone, topics, and the advisory partition owner."""

from __future__ import annotations

import datetime
import uuid
from dataclasses import dataclass
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.authorized import authorized_operations
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.cluster import client_zone
from icefloe.security.acls import Operation, ResourceType
from icefloe.topics import internal
from icefloe.topics.registry import Topic, TopicError

_NO_THROTTLE = datetime.timedelta(0)
_FIRST_VERSION_WITH_TOPIC_IDS = 12


@dataclass(frozen=True, slots=True)
class _Listed:
    """A topic Metadata describes: a stored one or the internal one."""

    name: str
    topic_id: uuid.UUID
    partitions: int
    is_internal: bool = False

    @classmethod
    def of(cls, topic: Topic) -> _Listed:
        return cls(topic.name, topic.topic_id, topic.partitions)

    @classmethod
    def consumer_offsets(cls, ctx: RequestContext) -> _Listed:
        return cls(
            internal.CONSUMER_OFFSETS,
            internal.topic_id(ctx.broker.cluster.cluster_id),
            internal.PARTITIONS,
            is_internal=True,
        )


_UNAUTHORIZED: Final = _Listed("", uuid.UUID(int=0), 0)
"""Stands for a topic the client may not describe (or create, when it asked to)."""


async def handle_metadata(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    broker = ctx.broker
    zone = client_zone(ctx.client_id)
    brokers = broker.cluster.brokers_for(zone)
    with_operations = getattr(request, "include_topic_authorized_operations", False)
    topics = [
        await _describe(ctx, module, zone, t, with_operations)
        for t in await _requested(ctx, request)
    ]
    # Only v8-v10 have the cluster's operations (later versions moved them to
    # DescribeCluster): named for the others, make() would import every version to be sure
    # the name is not misspelled, on a broker's first Metadata request.
    cluster_operations = {}
    if hasattr(request, "include_cluster_authorized_operations"):
        cluster_operations["cluster_authorized_operations"] = authorized_operations(
            ctx, request.include_cluster_authorized_operations, ResourceType.CLUSTER
        )
    return make(
        module.MetadataResponse,
        throttle_time=_NO_THROTTLE,
        brokers=tuple(
            make(
                module.MetadataResponseBroker,
                node_id=b.node_id,
                host=b.endpoint(ctx.connection.listener)[0],
                port=b.endpoint(ctx.connection.listener)[1],
                rack=b.zone,
            )
            for b in brokers
        ),
        cluster_id=broker.cluster.cluster_id,
        controller_id=min(b.node_id for b in brokers),
        topics=tuple(topics),
        **cluster_operations,
    )


async def _requested(
    ctx: RequestContext, request: Any
) -> list[tuple[str | None, Any, _Listed | None]]:
    """(name, id, topic) per requested topic; every topic when the request names none."""
    registry = ctx.broker.topics
    wanted = request.topics
    if wanted is None or (ctx.api_version == 0 and not wanted):
        every = [_Listed.of(t) for t in registry.cached()]
        every.append(_Listed.consumer_offsets(ctx))
        # A client sees only the topics it may describe, as in Kafka.
        return [
            (t.name, t.topic_id, t)
            for t in sorted(every, key=lambda t: t.name)
            if ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, t.name)
        ]
    found: list[tuple[str | None, Any, _Listed | None]] = []
    auto_create = ctx.broker.options.auto_create_topics and getattr(
        request, "allow_auto_topic_creation", True
    )
    for entry in wanted:
        name = getattr(entry, "name", entry)
        topic_id = getattr(entry, "topic_id", None)
        topic = None
        if name:
            if not ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, name):
                found.append((name, topic_id, _UNAUTHORIZED))
                continue
            topic = await registry.get(name)
            if topic is None and auto_create and not internal.is_internal(name):
                if not _may_create(ctx, name):
                    found.append((name, topic_id, _UNAUTHORIZED))
                    continue
                topic = await _auto_create(ctx, name)
        elif topic_id is not None:
            topic = registry.by_id(topic_id)
            if topic is not None and not ctx.allows(
                Operation.DESCRIBE, ResourceType.TOPIC, topic.name
            ):
                topic = None  # as Kafka answers: an id one may not describe is unknown
        listed = None if topic is None else _Listed.of(topic)
        if topic is None and (name or topic_id is not None):
            virtual = _Listed.consumer_offsets(ctx)
            if name == virtual.name or (not name and topic_id == virtual.topic_id):
                listed = virtual
        found.append((name, topic_id, listed))
    return found


def _may_create(ctx: RequestContext, name: str) -> bool:
    return ctx.allows(Operation.CREATE, ResourceType.CLUSTER) or ctx.allows(
        Operation.CREATE, ResourceType.TOPIC, name
    )


async def _auto_create(ctx: RequestContext, name: str) -> Topic | None:
    try:
        return await ctx.broker.topics.create(name, ctx.broker.options.default_partitions)
    except TopicError as exc:
        if exc.error_code is ErrorCode.topic_already_exists:
            return await ctx.broker.topics.get(name)
        return None


async def _describe(
    ctx: RequestContext,
    module: Any,
    zone: str | None,
    requested: tuple[str | None, Any, _Listed | None],
    with_operations: bool,
) -> Any:
    name, topic_id, topic = requested
    if topic is _UNAUTHORIZED:
        return make(
            module.MetadataResponseTopic,
            error_code=ErrorCode.topic_authorization_failed,
            name=name,
            topic_id=topic_id,
            partitions=(),
        )
    if name is None and ctx.api_version < _FIRST_VERSION_WITH_TOPIC_IDS:
        # As Kafka answers it: before v12 a topic is named, and a response cannot say null.
        return make(
            module.MetadataResponseTopic,
            error_code=ErrorCode.invalid_request,
            name="",
            topic_id=topic_id,
            partitions=(),
        )
    if topic is None:
        return make(
            module.MetadataResponseTopic,
            error_code=ErrorCode.unknown_topic_or_partition if name else ErrorCode.unknown_topic_id,
            name=name,
            topic_id=topic_id,
            partitions=(),
        )
    owners = ctx.broker.cluster.owners(topic.name, topic.partitions, zone)
    partitions = []
    for index in range(topic.partitions):
        owner = owners[index].node_id
        partitions.append(
            make(
                module.MetadataResponsePartition,
                error_code=ErrorCode.none,
                partition_index=index,
                leader_id=owner,
                leader_epoch=0,
                replica_nodes=(owner,),
                isr_nodes=(owner,),
                offline_replicas=(),
            )
        )
    return make(
        module.MetadataResponseTopic,
        error_code=ErrorCode.none,
        name=topic.name,
        topic_id=topic.topic_id,
        is_internal=topic.is_internal,
        partitions=tuple(partitions),
        topic_authorized_operations=authorized_operations(
            ctx, with_operations, ResourceType.TOPIC, topic.name
        ),
    )
