"""CreateTopics, DeleteTopics and CreatePartitions.

Every topic in a request gets its own result, as in Kafka: one bad topic does not fail the
others. A name given twice in one request is answered once, with INVALID_REQUEST, and nothing
is done for it.

Replication: Icefloe keeps no replicas (durability is the write-ahead log's), so any
replication factor a client asks for is accepted, -1 included, and the topic reports a
replication factor of 1, matching the single replica Metadata lists per partition. Refusing
factors above 1 would break every tool that defaults to 3; 0 and values below -1 are still
INVALID_REPLICATION_FACTOR, as in Kafka. A manual partition assignment is honoured by its
partition count only: any broker serves any partition, so there is nothing to place.
"""

from __future__ import annotations

import datetime
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.security.acls import Operation, ResourceType
from icefloe.topics import configs as topic_configs
from icefloe.topics import internal
from icefloe.topics.registry import MAX_PARTITIONS, Topic, TopicError, validate_topic_name

_NO_THROTTLE = datetime.timedelta(0)
_DEFAULT = -1
"""num_partitions / replication_factor meaning "the broker's default"."""
REPORTED_REPLICATION_FACTOR = 1


def duplicated(names: Iterable[Any]) -> set[Any]:
    """The values that occur more than once."""
    return {name for name, count in Counter(names).items() if count > 1}


def repeated(what: str) -> tuple[ErrorCode, str | None]:
    """The error of an item a request names more than once (nothing is done for it)."""
    return ErrorCode.invalid_request, f"{what} appears more than once in the request"


def _error(exc: TopicError) -> tuple[ErrorCode, str | None]:
    return exc.error_code, str(exc)


# --- CreateTopics ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _NewTopic:
    name: str
    partitions: int
    configs: dict[str, str]


async def handle_create_topics(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    twice = duplicated(t.name for t in request.topics)
    results: dict[str, Any] = {}
    for wanted in request.topics:
        if wanted.name in results:
            continue
        if wanted.name in twice:
            failure = repeated(f"topic {wanted.name!r}")
            results[wanted.name] = _create_failed(module, wanted.name, *failure)
            continue
        results[wanted.name] = await _create_one(ctx, module, wanted, request.validate_only)
    return make(
        module.CreateTopicsResponse, throttle_time=_NO_THROTTLE, topics=tuple(results.values())
    )


async def _create_one(ctx: RequestContext, module: Any, wanted: Any, validate_only: bool) -> Any:
    registry = ctx.broker.topics
    if not (
        ctx.allows(Operation.CREATE, ResourceType.CLUSTER)
        or ctx.allows(Operation.CREATE, ResourceType.TOPIC, wanted.name)
    ):
        return _create_failed(
            module,
            wanted.name,
            ErrorCode.topic_authorization_failed,
            f"not allowed to create topic {wanted.name!r}",
        )
    try:
        new = _plan(ctx, wanted)
        if validate_only:
            if await registry.get(new.name) is not None:
                raise TopicError(
                    ErrorCode.topic_already_exists, f"topic {new.name!r} already exists"
                )
            topic_id = None
        else:
            topic_id = (await registry.create(new.name, new.partitions, new.configs)).topic_id
    except TopicError as exc:
        return _create_failed(module, wanted.name, *_error(exc))
    return _created(ctx, module, new, topic_id)


def _plan(ctx: RequestContext, wanted: Any) -> _NewTopic:
    """What the request asks for, checked as Kafka checks it.

    Raises:
        TopicError: with the Kafka error of the first problem found.
    """
    validate_topic_name(wanted.name)
    refused = internal.creation_refused(wanted.name)
    if refused is not None:
        raise TopicError(*refused)
    return _NewTopic(
        wanted.name,
        _partition_count(ctx, wanted),
        topic_configs.validate(
            {c.name: c.value for c in _unique_configs(wanted.configs)}, ctx.broker.config.storage
        ),
    )


def _partition_count(ctx: RequestContext, wanted: Any) -> int:
    count = _assigned_count(wanted) if wanted.assignments else _asked_count(ctx, wanted)
    if not 1 <= count <= MAX_PARTITIONS:
        raise TopicError(
            ErrorCode.invalid_partitions,
            f"a topic needs between 1 and {MAX_PARTITIONS} partitions, got {count}",
        )
    return count


def _assigned_count(wanted: Any) -> int:
    """The partition count of a manual assignment (the brokers named in it do not matter)."""
    if wanted.num_partitions != _DEFAULT or wanted.replication_factor != _DEFAULT:
        raise TopicError(
            ErrorCode.invalid_request,
            "num_partitions and replication_factor must be -1 when assignments are given",
        )
    indexes = sorted(a.partition_index for a in wanted.assignments)
    if indexes != list(range(len(indexes))):
        raise TopicError(
            ErrorCode.invalid_replica_assignment,
            f"assigned partitions must be numbered 0 to {len(indexes) - 1}, got {indexes}",
        )
    return len(indexes)


def _asked_count(ctx: RequestContext, wanted: Any) -> int:
    if wanted.replication_factor == 0 or wanted.replication_factor < _DEFAULT:
        raise TopicError(
            ErrorCode.invalid_replication_factor,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    if wanted.num_partitions == _DEFAULT:
        return ctx.broker.options.default_partitions
    return int(wanted.num_partitions)


def _unique_configs(configs: Iterable[Any]) -> list[Any]:
    listed = list(configs)
    twice = duplicated(c.name for c in listed)
    if twice:
        raise TopicError(
            ErrorCode.invalid_request, f"configs given more than once: {', '.join(sorted(twice))}"
        )
    return listed


def _created(ctx: RequestContext, module: Any, new: _NewTopic, topic_id: uuid.UUID | None) -> Any:
    """A success result; v5+ carries the topic's partitions, replication factor and configs."""
    config_class = getattr(module, "CreatableTopicConfigs", None)  # v5+
    configs = None
    hidden = not ctx.allows(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, new.name)
    if config_class is not None and not hidden:
        configs = tuple(
            make(
                config_class,
                name=entry.name,
                value=entry.value,
                read_only=entry.read_only,
                config_source=int(entry.source),
                is_sensitive=entry.sensitive,
            )
            for entry in topic_configs.describe(new.configs, ctx.broker.config.storage)
        )
    return make(
        module.CreatableTopicResult,
        name=new.name,
        topic_id=topic_id,
        error_code=ErrorCode.none,
        error_message=None,
        num_partitions=new.partitions,
        replication_factor=REPORTED_REPLICATION_FACTOR,
        configs=configs,
        topic_config_error_code=(
            ErrorCode.topic_authorization_failed if hidden else ErrorCode.none
        ),
    )


def _create_failed(module: Any, name: str, code: ErrorCode, message: str | None) -> Any:
    return make(
        module.CreatableTopicResult,
        name=name,
        topic_id=None,
        error_code=code,
        error_message=message,
        num_partitions=-1,
        replication_factor=-1,
        configs=None,
    )


# --- DeleteTopics ----------------------------------------------------------------------------


async def handle_delete_topics(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    targets = _deletion_targets(request)
    twice = duplicated(targets)
    results = []
    for name, topic_id in dict.fromkeys(targets):
        if (name, topic_id) in twice:
            what = f"topic {name!r}" if name is not None else f"topic id {topic_id}"
            code, message = repeated(what)
        else:
            code, message, name, topic_id = await _delete_one(ctx, name, topic_id)
        results.append(
            make(
                module.DeletableTopicResult,
                name=name,
                topic_id=topic_id,
                error_code=code,
                error_message=message,
            )
        )
    return make(module.DeleteTopicsResponse, throttle_time=_NO_THROTTLE, responses=tuple(results))


def _deletion_targets(request: Any) -> list[tuple[str | None, uuid.UUID | None]]:
    """(name, id) per requested topic: v6 names topics or gives ids; v1–v5 only name them."""
    states = getattr(request, "topics", None)
    if states is None:
        return [(name, None) for name in request.topic_names]
    return [(state.name, state.topic_id) for state in states]


async def _delete_one(
    ctx: RequestContext, name: str | None, topic_id: uuid.UUID | None
) -> tuple[ErrorCode, str | None, str | None, uuid.UUID | None]:
    """(error, message, name, id) of deleting one topic, named or given by id."""
    if (name is None) == (topic_id is None):
        return ErrorCode.invalid_request, "give either a topic name or a topic id", name, topic_id
    if internal.is_internal(name) or (
        topic_id is not None and topic_id == internal.topic_id(ctx.broker.cluster.cluster_id)
    ):
        code, message = internal.deletion_refused()
        return code, message, internal.CONSUMER_OFFSETS, topic_id
    if topic_id is not None:
        topic = ctx.broker.topics.by_id(topic_id)
        if topic is None:
            return ErrorCode.unknown_topic_id, f"no topic has id {topic_id}", None, topic_id
        name = topic.name
    assert name is not None
    if not ctx.allows(Operation.DELETE, ResourceType.TOPIC, name):
        message = f"not allowed to delete topic {name!r}"
        return ErrorCode.topic_authorization_failed, message, name, topic_id
    try:
        deleted = await ctx.broker.topics.delete(name)
    except TopicError as exc:
        if topic_id is not None:  # deleted meanwhile: answer in the terms of the request
            return ErrorCode.unknown_topic_id, str(exc), name, topic_id
        return *_error(exc), name, None
    return ErrorCode.none, None, deleted.name, deleted.topic_id


# --- CreatePartitions ------------------------------------------------------------------------


async def handle_create_partitions(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    twice = duplicated(t.name for t in request.topics)
    results: dict[str, Any] = {}
    for wanted in request.topics:
        if wanted.name in results:
            continue
        if wanted.name in twice:
            code, message = repeated(f"topic {wanted.name!r}")
        else:
            code, message = await _grow(ctx, wanted, request.validate_only)
        results[wanted.name] = make(
            module.CreatePartitionsTopicResult,
            name=wanted.name,
            error_code=code,
            error_message=message,
        )
    return make(
        module.CreatePartitionsResponse, throttle_time=_NO_THROTTLE, results=tuple(results.values())
    )


async def _grow(
    ctx: RequestContext, wanted: Any, validate_only: bool
) -> tuple[ErrorCode, str | None]:
    registry = ctx.broker.topics
    if not ctx.allows(Operation.ALTER, ResourceType.TOPIC, wanted.name):
        return ErrorCode.topic_authorization_failed, f"not allowed to alter {wanted.name!r}"
    try:
        if internal.is_internal(wanted.name):
            raise TopicError(*internal.change_refused("partitions"))
        topic = await registry.get(wanted.name)
        if topic is None:
            raise TopicError(
                ErrorCode.unknown_topic_or_partition, f"topic {wanted.name!r} does not exist"
            )
        _check_growth(topic, wanted)
        if not validate_only:
            # The registry checks the count again against the stored topic, so a concurrent
            # CreatePartitions cannot make a topic shrink.
            await registry.add_partitions(wanted.name, wanted.count)
    except TopicError as exc:
        return _error(exc)
    return ErrorCode.none, None


def _check_growth(topic: Topic, wanted: Any) -> None:
    """Kafka's checks of a new partition count, with Kafka's messages."""
    if wanted.count < topic.partitions:
        raise TopicError(
            ErrorCode.invalid_partitions,
            f"Topic currently has {topic.partitions} partitions, which is higher than the "
            f"requested {wanted.count}.",
        )
    if wanted.count == topic.partitions:
        raise TopicError(
            ErrorCode.invalid_partitions, f"Topic already has {topic.partitions} partitions."
        )
    if wanted.count > MAX_PARTITIONS:
        raise TopicError(
            ErrorCode.invalid_partitions, f"a topic has at most {MAX_PARTITIONS} partitions"
        )
    added = wanted.count - topic.partitions
    if wanted.assignments is not None and len(wanted.assignments) != added:
        raise TopicError(
            ErrorCode.invalid_replica_assignment,
            f"Increasing the number of partitions by {added} but "
            f"{len(wanted.assignments)} assignments provided.",
        )
