"""DescribeClientQuotas and AlterClientQuotas (KIP-546): client quotas over the Kafka protocol,
as ``kafka-configs --entity-type users/clients`` and the Admin clients manage them.

Listing quotas takes DESCRIBE_CONFIGS on the cluster and changing them ALTER_CONFIGS, when ACLs
are on, as in Kafka. The answers and their error messages are Kafka's: INVALID_REQUEST for an
entity or filter Kafka refuses, an unknown key or a value out of range, and
UNSUPPORTED_VERSION for a filter on an entity type Kafka does not know. Quotas are enforced by
:mod:`icefloe.broker.quotas`.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import ConflictError
from icefloe.security.acls import Operation, ResourceType
from icefloe.security.quotas import (
    Entity,
    QuotaError,
    QuotaFilter,
    describe_entity,
    validated_entity,
    validated_value,
)

_NO_THROTTLE = datetime.timedelta(0)
_DESCRIBE_DENIED: Final = "listing client quotas takes DESCRIBE_CONFIGS on the cluster"
_ALTER_DENIED: Final = "changing client quotas takes ALTER_CONFIGS on the cluster"


async def handle_describe_client_quotas(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    if not ctx.allows(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
        return _describe_error(module, ErrorCode.cluster_authorization_failed, _DESCRIBE_DENIED)
    try:
        quota_filter = QuotaFilter.of(
            [(c.entity_type, int(c.match_type), c.match) for c in request.components],
            bool(request.strict),
        )
    except QuotaError as exc:
        code = ErrorCode.unsupported_version if exc.unsupported else ErrorCode.invalid_request
        return _describe_error(module, code, str(exc))
    entries = []
    if quota_filter.exact or quota_filter.present or not quota_filter.strict:
        for found, values in ctx.broker.quota_store.items():
            if quota_filter.matches(found):
                entries.append(
                    make(
                        module.EntryData,
                        entity=_entity_data(module, found),
                        values=tuple(
                            make(module.ValueData, key=key, value=value)
                            for key, value in sorted(values.items())
                        ),
                    )
                )
    return make(
        module.DescribeClientQuotasResponse,
        throttle_time=_NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        entries=tuple(entries),
    )


def _describe_error(module: Any, code: ErrorCode, message: str) -> Any:
    return make(
        module.DescribeClientQuotasResponse,
        throttle_time=_NO_THROTTLE,
        error_code=code,
        error_message=message,
        entries=None,
    )


async def handle_alter_client_quotas(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    allowed = ctx.allows(Operation.ALTER_CONFIGS, ResourceType.CLUSTER)
    # One result per entity, in request order; an entity named twice is refused (Kafka's
    # "Ignoring duplicate entity") and neither of its entries applies.
    results: dict[Any, tuple[Entity | None, ErrorCode, str | None]] = {}
    changes: dict[Any, dict[str, float | None]] = {}
    for entry in request.entries:
        wire = tuple((e.entity_type, e.entity_name) for e in entry.entity)
        if wire in results:
            results[wire] = (None, ErrorCode.invalid_request, f"Ignoring duplicate entity {wire}")
            changes.pop(wire, None)
            continue
        if not allowed:
            results[wire] = (None, ErrorCode.cluster_authorization_failed, _ALTER_DENIED)
            continue
        try:
            parsed = validated_entity(list(wire))
            changes[wire] = _changes(parsed, entry.ops)
        except QuotaError as exc:
            results[wire] = (None, ErrorCode.invalid_request, str(exc))
            continue
        results[wire] = (parsed, ErrorCode.none, None)
    if not request.validate_only:
        store = ctx.broker.quota_store
        for wire, wanted in changes.items():
            target, code, _ = results[wire]
            if target is None or code is not ErrorCode.none:
                continue
            try:
                await store.alter(target, wanted)
            except (QuotaError, ConflictError) as exc:
                results[wire] = (target, ErrorCode.invalid_request, str(exc))
    return make(
        module.AlterClientQuotasResponse,
        throttle_time=_NO_THROTTLE,
        entries=tuple(
            make(
                module.EntryData,
                error_code=code,
                error_message=message,
                entity=tuple(
                    make(module.EntityData, entity_type=kind, entity_name=name)
                    for kind, name in wire
                ),
            )
            for wire, (_, code, message) in results.items()
        ),
    )


def _changes(parsed: Entity, ops: Any) -> dict[str, float | None]:
    """The keys to set (a value) or remove (``None``), checked as Kafka checks them."""
    wanted: dict[str, float | None] = {}
    for op in ops:
        if op.key in wanted:
            raise QuotaError(
                f"Duplicate quota key {op.key} not updating quota for this entity "
                f"{describe_entity(parsed)}"
            )
        wanted[op.key] = None if op.remove else validated_value(op.key, float(op.value))
    return wanted


def _entity_data(module: Any, found: Entity) -> tuple[Any, ...]:
    return tuple(
        make(module.EntityData, entity_type=kind, entity_name=name) for kind, name in found
    )
