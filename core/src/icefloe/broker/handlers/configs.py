"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs, for topics and brokers.

Topic configs are those of :mod:`icefloe.topics.configs`. A broker resource is a
read-only view of the broker's settings under their Kafka names: they come from Icefloe's
configuration file and environment, so altering them through Kafka's API is refused with
INVALID_REQUEST, as Kafka refuses configs that cannot change at run time.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode
from pydantic import BaseModel

from icefloe.broker.handlers.topics import duplicated, repeated
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import KafkaError
from icefloe.security import acls
from icefloe.topics import configs as topic_configs
from icefloe.topics import internal
from icefloe.topics.configs import (
    AlterOp,
    ConfigEntry,
    ConfigSource,
    ConfigType,
    Synonym,
)
from icefloe.topics.registry import Topic, TopicError, validate_topic_name

_NO_THROTTLE = datetime.timedelta(0)


class ResourceType(enum.IntEnum):
    """Kafka's config resource types (the ones Icefloe has configs for)."""

    TOPIC = 2
    BROKER = 4


class _Refused(KafkaError):
    """A resource answered with an error."""


def _resource_type(value: int) -> ResourceType:
    try:
        return ResourceType(value)
    except ValueError:
        raise _Refused(
            ErrorCode.invalid_request, f"Icefloe has no configs for resources of type {value}"
        ) from None


async def _topic(ctx: RequestContext, name: str) -> Topic:
    validate_topic_name(name)
    topic = await ctx.broker.topics.get(name)
    if topic is None:
        raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
    return topic


# --- DescribeConfigs -------------------------------------------------------------------------


async def handle_describe_configs(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    # include_documentation exists from v3 on; earlier versions have no documentation field.
    documentation = getattr(request, "include_documentation", False)
    results = [
        await _describe_resource(ctx, module, r, request.include_synonyms, documentation)
        for r in request.resources
    ]
    return make(module.DescribeConfigsResponse, throttle_time=_NO_THROTTLE, results=tuple(results))


async def _describe_resource(
    ctx: RequestContext, module: Any, resource: Any, synonyms: bool, documentation: bool
) -> Any:
    code, message = ErrorCode.none, None
    try:
        _check_allowed(ctx, acls.Operation.DESCRIBE_CONFIGS, resource)
        entries = await _entries(ctx, resource.resource_type, resource.resource_name)
    except (TopicError, _Refused) as exc:
        code, message, entries = exc.error_code, str(exc), []
    if resource.configuration_keys is not None:  # null means every config
        entries = [e for e in entries if e.name in resource.configuration_keys]
    return make(
        module.DescribeConfigsResult,
        error_code=code,
        error_message=message,
        resource_type=resource.resource_type,
        resource_name=resource.resource_name,
        configs=tuple(_described(module, e, synonyms, documentation) for e in entries),
    )


async def _entries(ctx: RequestContext, resource_type: int, name: str) -> list[ConfigEntry]:
    if _resource_type(resource_type) is ResourceType.TOPIC:
        if internal.is_internal(name):
            return topic_configs.describe(internal.CONFIGS, ctx.broker.config.storage)
        topic = await _topic(ctx, name)
        return topic_configs.describe(topic.configs, ctx.broker.config.storage)
    if name == "":
        return []  # Kafka's cluster-wide dynamic broker defaults: Icefloe has none
    _check_own_id(ctx, name)
    return broker_entries(ctx)


def _check_own_id(ctx: RequestContext, name: str) -> None:
    # Each broker describes only itself, as in Kafka: brokers may run with different settings.
    own = ctx.broker.me.node_id
    if name != str(own):
        raise _Refused(
            ErrorCode.invalid_request,
            f"Unexpected broker id, expected {own} or empty string, but received {name}",
        )


def _described(module: Any, entry: ConfigEntry, synonyms: bool, documentation: bool) -> Any:
    return make(
        module.DescribeConfigsResourceResult,
        name=entry.name,
        value=entry.value,
        read_only=entry.read_only,
        config_source=int(entry.source),
        is_sensitive=entry.sensitive,
        synonyms=tuple(
            make(module.DescribeConfigsSynonym, name=s.name, value=s.value, source=int(s.source))
            for s in (entry.synonyms if synonyms else ())
        ),
        config_type=int(entry.type),
        documentation=entry.documentation if documentation else None,
    )


@dataclass(frozen=True, slots=True)
class _BrokerSetting:
    """A broker config under its Kafka name, and the Icefloe option that sets it."""

    kafka_name: str
    type: ConfigType
    section: str
    """``broker`` or ``storage``."""
    option: str
    meaning: str

    def entry(self, options: BaseModel, value: str | None) -> ConfigEntry:
        explicit = self.option in options.model_fields_set
        source = ConfigSource.STATIC_BROKER_CONFIG if explicit else ConfigSource.DEFAULT_CONFIG
        documentation = f"{self.meaning} Set by {self.section}.{self.option} in Icefloe's config."
        return ConfigEntry(
            self.kafka_name,
            value,
            source,
            self.type,
            documentation,
            (Synonym(self.kafka_name, value, source),),
            read_only=True,
        )


_BROKER_SETTINGS = (
    _BrokerSetting(
        "advertised.listeners",
        ConfigType.LIST,
        "broker",
        "advertised_host",
        "Where clients reach this broker.",
    ),
    _BrokerSetting(
        "auto.create.topics.enable",
        ConfigType.BOOLEAN,
        "broker",
        "auto_create_topics",
        "Whether Metadata requests create unknown topics.",
    ),
    _BrokerSetting(
        "broker.id",
        ConfigType.INT,
        "broker",
        "node_id",
        "This broker's id (allocated from the metadata store when unset).",
    ),
    _BrokerSetting("broker.rack", ConfigType.STRING, "broker", "zone", "This broker's zone."),
    _BrokerSetting(
        "message.max.bytes",
        ConfigType.INT,
        "storage",
        "max_batch_bytes",
        "Largest record batch accepted.",
    ),
    _BrokerSetting(
        "num.partitions",
        ConfigType.INT,
        "broker",
        "default_partitions",
        "Partitions of topics created without a partition count.",
    ),
    _BrokerSetting(
        "socket.request.max.bytes",
        ConfigType.INT,
        "broker",
        "max_request_bytes",
        "Largest request accepted.",
    ),
)


def broker_entries(ctx: RequestContext) -> list[ConfigEntry]:
    """This broker's settings as read-only Kafka broker configs."""
    broker = ctx.broker
    me = broker.me
    values: dict[str, str | None] = {
        "advertised.listeners": ",".join(f"{n}://{h}:{p}" for n, h, p in me.listeners)
        or f"PLAINTEXT://{me.host}:{me.port}",
        "auto.create.topics.enable": str(broker.options.auto_create_topics).lower(),
        "broker.id": str(me.node_id),
        "broker.rack": me.zone,
        "message.max.bytes": str(broker.config.storage.max_batch_bytes),
        "num.partitions": str(broker.options.default_partitions),
        "socket.request.max.bytes": str(broker.options.max_request_bytes),
    }
    sections: dict[str, BaseModel] = {
        "broker": broker.options,
        "storage": broker.config.storage,
    }
    return [s.entry(sections[s.section], values[s.kafka_name]) for s in _BROKER_SETTINGS]


# --- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------

_Change = Callable[[dict[str, str]], dict[str, str]]
"""The topic's new configs, from its current ones."""


async def handle_alter_configs(ctx: RequestContext, request: Any) -> Any:
    """Replace each resource's whole config set: configs not named return to their defaults."""

    storage = ctx.broker.config.storage

    def replacement(resource: Any) -> _Change:
        wanted = {c.name: c.value for c in resource.configs}
        return lambda _current: topic_configs.validate(wanted, storage)

    return await _alter_all(ctx, request, replacement, "AlterConfigsResponse")


async def handle_incremental_alter_configs(ctx: RequestContext, request: Any) -> Any:
    """Apply SET, DELETE, APPEND and SUBTRACT to each resource's configs."""
    storage = ctx.broker.config.storage

    def operations(resource: Any) -> _Change:
        changes = [(c.name, _operation(c.config_operation), c.value) for c in resource.configs]
        return lambda current: topic_configs.alter_incrementally(current, changes, storage)

    return await _alter_all(ctx, request, operations, "IncrementalAlterConfigsResponse")


def _operation(value: int) -> AlterOp:
    try:
        return AlterOp(value)
    except ValueError:
        raise _Refused(ErrorCode.invalid_request, f"unknown config operation {value}") from None


async def _alter_all(
    ctx: RequestContext, request: Any, change: Callable[[Any], _Change], response: str
) -> Any:
    module = ctx.response_module()
    twice = duplicated((r.resource_type, r.resource_name) for r in request.resources)
    responses = []
    for resource in request.resources:
        if (resource.resource_type, resource.resource_name) in twice:
            code, message = repeated(f"resource {resource.resource_name!r}")
        else:
            code, message = await _alter(ctx, resource, change, request.validate_only)
        responses.append(
            make(
                module.AlterConfigsResourceResponse,
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
        )
    return make(getattr(module, response), throttle_time=_NO_THROTTLE, responses=tuple(responses))


async def _alter(
    ctx: RequestContext, resource: Any, change: Callable[[Any], _Change], validate_only: bool
) -> tuple[ErrorCode, str | None]:
    try:
        _check_allowed(ctx, acls.Operation.ALTER_CONFIGS, resource)
        _check_unique_keys(resource.configs)
        if _resource_type(resource.resource_type) is ResourceType.BROKER:
            _refuse_broker_change(resource.configs)
            return ErrorCode.none, None
        if internal.is_internal(resource.resource_name):
            raise _Refused(*internal.change_refused("configs"))
        topic = await _topic(ctx, resource.resource_name)
        configs = change(resource)(topic.configs)
        if not validate_only:
            # A concurrent alteration between the read above and this write may be lost;
            # TopicRegistry.set_configs replaces the whole set.
            await ctx.broker.topics.set_configs(topic.name, configs)
    except (TopicError, _Refused) as exc:
        return exc.error_code, str(exc)
    return ErrorCode.none, None


def _check_allowed(ctx: RequestContext, operation: acls.Operation, resource: Any) -> None:
    """Kafka's check: the operation on the topic, or on the cluster for a broker's configs."""
    if _resource_type(resource.resource_type) is ResourceType.TOPIC:
        if not ctx.allows(operation, acls.ResourceType.TOPIC, resource.resource_name):
            raise _Refused(
                ErrorCode.topic_authorization_failed,
                f"{operation.name} on topic {resource.resource_name!r} is not allowed",
            )
    elif not ctx.allows(operation, acls.ResourceType.CLUSTER):
        raise _Refused(
            ErrorCode.cluster_authorization_failed,
            f"{operation.name} on the cluster is not allowed",
        )


def _check_unique_keys(configs: Sequence[Any]) -> None:
    twice = duplicated(c.name for c in configs)
    if twice:
        raise _Refused(
            ErrorCode.invalid_request,
            f"Error due to duplicate config keys: {', '.join(sorted(twice))}",
        )


def _refuse_broker_change(configs: Sequence[Any]) -> None:
    if configs:
        names = ", ".join(c.name for c in configs)
        raise _Refused(
            ErrorCode.invalid_request,
            f"Cannot update these configs dynamically: {names}; broker settings come from "
            "Icefloe's configuration file and environment (see `icefloe config show`)",
        )
