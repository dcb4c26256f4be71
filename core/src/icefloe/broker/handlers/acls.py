"""CreateAcls, DescribeAcls and DeleteAcls: the cluster's ACLs over the Kafka protocol, as
``kafka-acls.sh`` and the Admin clients manage them.

Managing ACLs takes ALTER on the cluster (DESCRIBE to list them), as in Kafka; with
``[security.acls] enabled = false`` every call answers SECURITY_DISABLED.
"""

from __future__ import annotations

import datetime
from typing import Any, Final

from kio.schema.errors import ErrorCode

from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import ConflictError
from icefloe.security.acls import (
    Acl,
    AclFilter,
    Entry,
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourceType,
    acl_problem,
)

_NO_THROTTLE = datetime.timedelta(0)
_DISABLED: Final = "ACLs are off on this cluster: set [security.acls] enabled = true to manage them"
_NOT_ALLOWED: Final = "managing ACLs takes ALTER on the cluster"


async def handle_create_acls(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    outcomes: list[tuple[ErrorCode, str | None]] = []
    valid: list[Acl] = []
    if not ctx.broker.authorizer.enabled:
        outcomes = [(ErrorCode.security_disabled, _DISABLED)] * len(request.creations)
    elif not ctx.allows(Operation.ALTER, ResourceType.CLUSTER):
        outcomes = [(ErrorCode.cluster_authorization_failed, _NOT_ALLOWED)] * len(request.creations)
    else:
        for creation in request.creations:
            acl = _acl(creation)
            problem = "unknown code in the ACL" if acl is None else acl_problem(acl)
            if problem is None and acl is not None:
                valid.append(acl)
                outcomes.append((ErrorCode.none, None))
            else:
                outcomes.append((ErrorCode.invalid_request, problem))
        try:
            await ctx.broker.acls.add(valid)
        except (ValueError, ConflictError) as exc:
            outcomes = [
                (ErrorCode.invalid_request, str(exc)) if code is ErrorCode.none else (code, text)
                for code, text in outcomes
            ]
    return make(
        module.CreateAclsResponse,
        throttle_time=_NO_THROTTLE,
        results=tuple(
            make(module.AclCreationResult, error_code=code, error_message=text)
            for code, text in outcomes
        ),
    )


async def handle_describe_acls(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    error, message, found = ErrorCode.none, None, []
    acl_filter = _filter(request)
    if not ctx.broker.authorizer.enabled:
        error, message = ErrorCode.security_disabled, _DISABLED
    elif not ctx.allows(Operation.DESCRIBE, ResourceType.CLUSTER):
        error, message = ErrorCode.cluster_authorization_failed, "listing ACLs takes DESCRIBE"
    elif acl_filter is None or (message := acl_filter.problem()) is not None:
        error, message = ErrorCode.invalid_request, message or "unknown code in the filter"
    else:
        found = ctx.broker.acls.matching(acl_filter)
    by_resource: dict[Resource, list[Entry]] = {}
    for acl in found:
        by_resource.setdefault(acl.resource, []).append(acl.entry)
    return make(
        module.DescribeAclsResponse,
        throttle_time=_NO_THROTTLE,
        error_code=error,
        error_message=message,
        resources=tuple(
            make(
                module.DescribeAclsResource,
                resource_type=resource.type,
                resource_name=resource.name,
                pattern_type=resource.pattern,
                acls=tuple(
                    make(
                        module.AclDescription,
                        principal=e.principal,
                        host=e.host,
                        operation=e.operation,
                        permission_type=e.permission,
                    )
                    for e in sorted(entries, key=_entry_order)
                ),
            )
            for resource, entries in sorted(by_resource.items(), key=lambda r: _order(r[0]))
        ),
    )


async def handle_delete_acls(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    results = []
    for wire_filter in request.filters:
        error, message, removed = ErrorCode.none, None, []
        acl_filter = _filter(wire_filter)
        if not ctx.broker.authorizer.enabled:
            error, message = ErrorCode.security_disabled, _DISABLED
        elif not ctx.allows(Operation.ALTER, ResourceType.CLUSTER):
            error, message = ErrorCode.cluster_authorization_failed, _NOT_ALLOWED
        elif acl_filter is None or (message := acl_filter.problem()) is not None:
            error, message = ErrorCode.invalid_request, message or "unknown code in the filter"
        else:
            try:
                removed = await ctx.broker.acls.remove(acl_filter)
            except ConflictError as exc:
                error, message = ErrorCode.unknown_server_error, str(exc)
        results.append(
            make(
                module.DeleteAclsFilterResult,
                error_code=error,
                error_message=message,
                matching_acls=tuple(
                    make(
                        module.DeleteAclsMatchingAcl,
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=a.resource.type,
                        resource_name=a.resource.name,
                        pattern_type=a.resource.pattern,
                        principal=a.entry.principal,
                        host=a.entry.host,
                        operation=a.entry.operation,
                        permission_type=a.entry.permission,
                    )
                    for a in removed
                ),
            )
        )
    return make(
        module.DeleteAclsResponse, throttle_time=_NO_THROTTLE, filter_results=tuple(results)
    )


def _acl(creation: Any) -> Acl | None:
    """The ACL a CreateAcls entry asks for, or ``None`` if a code is not Kafka's."""
    try:
        return Acl(
            Resource(
                ResourceType(creation.resource_type),
                creation.resource_name,
                PatternType(creation.resource_pattern_type),
            ),
            Entry(
                creation.principal,
                creation.host,
                Operation(creation.operation),
                Permission(creation.permission_type),
            ),
        )
    except ValueError:
        return None


def _filter(wire: Any) -> AclFilter | None:
    """The filter a DescribeAcls request or DeleteAcls entry holds, or ``None`` if a code is
    not Kafka's."""
    try:
        return AclFilter(
            ResourceType(wire.resource_type_filter),
            wire.resource_name_filter,
            PatternType(wire.pattern_type_filter),
            wire.principal_filter,
            wire.host_filter,
            Operation(wire.operation),
            Permission(wire.permission_type),
        )
    except ValueError:
        return None


def _order(resource: Resource) -> tuple[int, str, int]:
    return resource.type, resource.name, resource.pattern


def _entry_order(entry: Entry) -> tuple[str, str, int, int]:
    return entry.principal, entry.host, entry.operation, entry.permission
