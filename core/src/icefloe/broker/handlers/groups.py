"""Group coordination, classic protocol: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, DescribeGroups, ListGroups, DeleteGroups. (FindCoordinator also names transaction
coordinators, by the same rendezvous hashing; see :mod:`.transactions`.)

Every broker is a coordinator for every group: state lives in the metadata store and each
change is a compare-and-set, so the broker a client reaches can always serve it. The
coordinator FindCoordinator names is a *routing hint* (rendezvous hash of group and client
zone), which keeps a group's members on one broker per zone, so long polls are woken by local
notifications. No request is ever answered NOT_COORDINATOR: that would only send the client
back to FindCoordinator for the same answer, and while the broker list changes (a broker
starting or dying moves hashes) it could bounce clients between brokers. When the metadata
store cannot be reached the answer is COORDINATOR_NOT_AVAILABLE, which clients retry after
looking the coordinator up again.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.authorized import authorized_operations
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.cluster import BrokerInfo, client_zone
from icefloe.errors import IcefloeError
from icefloe.groups import classic
from icefloe.groups.model import ClassicGroup, ClassicState, Group, is_empty
from icefloe.security.acls import Operation, ResourceType

_NO_THROTTLE = datetime.timedelta(0)
_GROUP_KEY = 0
_TRANSACTION_KEY = 1
_WAIT_MARGIN_S = 5.0
"""Extra time a long poll waits beyond the protocol's own deadline (a lease failing over)."""

T = TypeVar("T")


def store_error(exc: IcefloeError) -> ErrorCode:
    """The Kafka error for a metadata-store failure: retriable ones send the client to look the
    coordinator up again and retry."""
    return ErrorCode.coordinator_not_available if exc.retriable else ErrorCode.unknown_server_error


async def guarded(make_error: Callable[[ErrorCode], T], work: Awaitable[T]) -> T:
    """``await work``, answering a metadata-store failure with ``make_error(code)``."""
    try:
        return await work
    except IcefloeError as exc:
        return make_error(store_error(exc))


def may_read(ctx: RequestContext, group_id: str) -> bool:
    """Whether the client may take part in the group (READ on it)."""
    return ctx.allows(Operation.READ, ResourceType.GROUP, group_id)


def _not_allowed(group_id: str) -> str:
    return f"not allowed to use group {group_id!r}"


def client_host(ctx: RequestContext) -> str:
    peer = ctx.connection.peer  # str((host, port)) of the socket
    return "/" + peer.strip("()").split(",")[0].strip("'\"")


def new_member_id(prefix: str) -> str:
    """Kafka's member id: the client id (or instance id) and a random UUID."""
    return f"{prefix}-{uuid.uuid4()}"


def _ms(value: datetime.timedelta | None) -> int:
    return -1 if value is None else int(value.total_seconds() * 1000)


# --- FindCoordinator ------------------------------------------------------------------------


async def handle_find_coordinator(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    key_type = int(getattr(request, "key_type", _GROUP_KEY))
    names = request.coordinator_keys if ctx.api_version >= 4 else (request.key,)
    zone = client_zone(ctx.client_id)
    answers: list[tuple[str, ErrorCode, str | None, BrokerInfo | None]] = []
    cluster = ctx.broker.cluster
    for name in names:
        if key_type == _TRANSACTION_KEY:
            if not ctx.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, name):
                code = ErrorCode.transactional_id_authorization_failed
                answers.append((name, code, f"not allowed to use {name!r}", None))
            else:
                answers.append(
                    (name, ErrorCode.none, None, cluster.transaction_coordinator(name, zone))
                )
        elif key_type != _GROUP_KEY:
            answers.append((name, ErrorCode.invalid_request, f"unknown key type {key_type}", None))
        elif not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, name):
            answers.append((name, ErrorCode.group_authorization_failed, _not_allowed(name), None))
        else:
            answers.append((name, ErrorCode.none, None, cluster.coordinator(name, zone)))

    def fields(error: ErrorCode, message: str | None, broker: BrokerInfo | None) -> dict[str, Any]:
        return {
            "error_code": error,
            "error_message": message,
            "node_id": broker.node_id if broker else -1,
            "host": broker.endpoint(ctx.connection.listener)[0] if broker else "",
            "port": broker.endpoint(ctx.connection.listener)[1] if broker else -1,
        }

    if ctx.api_version >= 4:
        coordinators = tuple(
            make(module.Coordinator, key=name, **fields(error, message, broker))
            for name, error, message, broker in answers
        )
        return make(
            module.FindCoordinatorResponse, throttle_time=_NO_THROTTLE, coordinators=coordinators
        )
    _, error, message, broker = answers[0]
    return make(
        module.FindCoordinatorResponse,
        throttle_time=_NO_THROTTLE,
        **fields(error, message, broker),
    )


# --- JoinGroup ------------------------------------------------------------------------------


async def handle_join_group(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    v7 = ctx.api_version >= 7

    def answer(error: ErrorCode, member_id: str, group: ClassicGroup | None = None) -> Any:
        ok = group is not None and error is ErrorCode.none
        return make(
            module.JoinGroupResponse,
            throttle_time=_NO_THROTTLE,
            error_code=error,
            generation_id=group.generation if ok and group else -1,
            protocol_type=group.protocol_type if ok and group else None,
            protocol_name=(group.protocol_name if ok and group else None) or (None if v7 else ""),
            leader=(group.leader or "") if ok and group else "",
            skip_assignment=False,
            member_id=member_id,
            members=tuple(
                make(
                    module.JoinGroupResponseMember,
                    member_id=member,
                    group_instance_id=instance,
                    metadata=metadata,
                )
                for member, instance, metadata in (
                    classic.join_members(group, member_id) if ok and group else []
                )
            ),
        )

    group_id = request.group_id
    if not group_id:
        return answer(ErrorCode.invalid_group_id, request.member_id)
    if not may_read(ctx, group_id):
        return answer(ErrorCode.group_authorization_failed, request.member_id)
    session_ms = _ms(request.session_timeout)
    rebalance_ms = _ms(getattr(request, "rebalance_timeout", None))
    instance_id = getattr(request, "group_instance_id", None)
    join = classic.JoinRequest(
        member_id=request.member_id,
        instance_id=instance_id,
        client_id=ctx.client_id,
        client_host=client_host(ctx),
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=rebalance_ms if rebalance_ms > 0 else session_ms,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, p.metadata) for p in request.protocols),
        require_known_member_id=ctx.api_version >= 4,
    )
    coordinator = ctx.broker.groups
    fresh_id = new_member_id(instance_id or ctx.client_id)

    async def run() -> Any:
        decision = await coordinator.store.update(
            group_id,
            lambda g, now: classic.join(g, group_id, join, now, coordinator.options, fresh_id),
        )
        outcome = decision.result
        if isinstance(outcome, classic.JoinError):
            return answer(outcome.error, outcome.member_id or request.member_id)
        member_id = outcome.member_id
        if isinstance(outcome, classic.JoinNow):
            assert decision.stored is not None
            assert isinstance(decision.stored.group, ClassicGroup)
            # Answered from the record as it is: the member's session starts over here.
            await coordinator.store.touch(group_id, member_id)
            return answer(ErrorCode.none, member_id, decision.stored.group)

        def joined(group: Group | None) -> tuple[ErrorCode, Group | None] | None:
            error = classic.join_result(group, member_id, outcome.after)
            return None if error is None else (error, group)

        waited = await coordinator.wait_for(
            group_id, joined, join.rebalance_timeout_ms / 1000 + _WAIT_MARGIN_S
        )
        if waited is None:
            return answer(ErrorCode.rebalance_in_progress, member_id)
        error, group = waited
        assert group is None or isinstance(group, ClassicGroup)
        return answer(error, member_id, group)

    return await guarded(lambda code: answer(code, request.member_id), run())


# --- SyncGroup ------------------------------------------------------------------------------


async def handle_sync_group(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()

    def answer(error: ErrorCode, assignment: bytes = b"", group: Group | None = None) -> Any:
        known = group if isinstance(group, ClassicGroup) and error is ErrorCode.none else None
        return make(
            module.SyncGroupResponse,
            throttle_time=_NO_THROTTLE,
            error_code=error,
            protocol_type=known.protocol_type if known else None,
            protocol_name=known.protocol_name if known else None,
            assignment=assignment,
        )

    group_id = request.group_id
    if not group_id:
        return answer(ErrorCode.invalid_group_id)
    if not may_read(ctx, group_id):
        return answer(ErrorCode.group_authorization_failed)
    member_id = request.member_id
    generation = int(request.generation_id)
    instance_id = getattr(request, "group_instance_id", None)
    assignments = {a.member_id: a.assignment for a in request.assignments}
    coordinator = ctx.broker.groups

    async def run() -> Any:
        decision = await coordinator.store.update(
            group_id,
            lambda g, now: classic.sync(
                g,
                member_id,
                instance_id,
                generation,
                getattr(request, "protocol_type", None),
                getattr(request, "protocol_name", None),
                assignments,
                now,
            ),
        )
        outcome = decision.result
        group = decision.stored.group if decision.stored else None
        if isinstance(outcome, classic.SyncWait):
            waiting = group.member(member_id) if isinstance(group, ClassicGroup) else None
            assert waiting is not None  # SyncWait is only decided for a member of the group

            def synced(group: Group | None) -> tuple[classic.SyncOutcome, Group | None] | None:
                result = classic.sync_result(group, member_id, generation)
                return None if result is None else (result, group)

            async with coordinator.kept_alive(group_id, member_id, waiting.session_timeout_ms):
                waited = await coordinator.wait_for(
                    group_id, synced, waiting.rebalance_timeout_ms / 1000 + _WAIT_MARGIN_S
                )
            if waited is None:
                return answer(ErrorCode.rebalance_in_progress)
            outcome, group = waited
        if isinstance(outcome, classic.SyncError):
            return answer(outcome.error)
        assert isinstance(outcome, classic.SyncNow)
        await coordinator.store.touch(group_id, member_id)
        return answer(ErrorCode.none, outcome.assignment, group)

    return await guarded(answer, run())


# --- Heartbeat and LeaveGroup ---------------------------------------------------------------


async def handle_heartbeat(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()

    def answer(error: ErrorCode) -> Any:
        return make(module.HeartbeatResponse, throttle_time=_NO_THROTTLE, error_code=error)

    if not request.group_id:
        return answer(ErrorCode.invalid_group_id)
    if not may_read(ctx, request.group_id):
        return answer(ErrorCode.group_authorization_failed)
    store = ctx.broker.groups.store

    async def run() -> Any:
        stored = await store.load(request.group_id)
        error = classic.heartbeat(
            stored.group if stored else None,
            request.member_id,
            getattr(request, "group_instance_id", None),
            int(request.generation_id),
        )
        if error in (ErrorCode.none, ErrorCode.rebalance_in_progress):
            await store.touch(request.group_id, request.member_id)
        return answer(error)

    return await guarded(answer, run())


async def handle_leave_group(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    batched = ctx.api_version >= 3
    leaving = (
        [(m.member_id, m.group_instance_id) for m in request.members]
        if batched
        else [(request.member_id, None)]
    )

    def answer(error: ErrorCode, errors: list[ErrorCode] | None = None) -> Any:
        members = tuple(
            make(
                module.MemberResponse,
                member_id=member_id,
                group_instance_id=instance_id,
                error_code=code,
            )
            for (member_id, instance_id), code in zip(leaving, errors or [], strict=False)
        )
        return make(
            module.LeaveGroupResponse,
            throttle_time=_NO_THROTTLE,
            error_code=error,
            members=members,
        )

    group_id = request.group_id
    if not group_id:
        return answer(ErrorCode.invalid_group_id)
    if not may_read(ctx, group_id):
        return answer(ErrorCode.group_authorization_failed)
    coordinator = ctx.broker.groups

    async def run() -> Any:
        decision = await coordinator.store.update(
            group_id, lambda g, now: classic.leave(g, leaving, now, coordinator.options)
        )
        errors = decision.result
        left = [m for (m, _), e in zip(leaving, errors, strict=True) if e is ErrorCode.none]
        await coordinator.store.forget(group_id, [m for m in left if m])
        if batched:
            return answer(ErrorCode.none, errors)
        return answer(errors[0])

    return await guarded(answer, run())


# --- DescribeGroups, ListGroups, DeleteGroups -----------------------------------------------


async def handle_describe_groups(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    store = ctx.broker.groups.store

    def described(group_id: str, error: ErrorCode, group: Group | None, message: str | None) -> Any:
        members: list[Any] = []
        state, protocol_type, protocol_data = "Dead", "", ""
        if isinstance(group, ClassicGroup):
            stable = group.state is ClassicState.STABLE
            state, protocol_type = group.state_name, group.protocol_type or ""
            protocol_data = (group.protocol_name or "") if stable else ""
            members = [
                make(
                    module.DescribedGroupMember,
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=m.metadata_for(group.protocol_name)
                    if stable and group.protocol_name
                    else b"",
                    member_assignment=m.assignment if stable else b"",
                )
                for m in group.members
            ]
        return make(
            module.DescribedGroup,
            error_code=error,
            error_message=message,
            group_id=group_id,
            group_state=state,
            protocol_type=protocol_type,
            protocol_data=protocol_data,
            members=tuple(members),
            authorized_operations=authorized_operations(
                ctx,
                getattr(request, "include_authorized_operations", False) and group is not None,
                ResourceType.GROUP,
                group_id,
            ),
        )

    out = []
    for group_id in request.groups:
        if not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            out.append(
                described(
                    group_id, ErrorCode.group_authorization_failed, None, _not_allowed(group_id)
                )
            )
            continue
        try:
            stored = await store.load(group_id)
        except IcefloeError as exc:
            out.append(described(group_id, store_error(exc), None, str(exc)))
            continue
        group = stored.group if stored else None
        if group is not None and not isinstance(group, ClassicGroup):
            out.append(
                described(
                    group_id,
                    ErrorCode.group_id_not_found,
                    None,
                    f"Group {group_id} is not a classic group.",
                )
            )
        elif group is None and ctx.api_version >= 6:
            out.append(
                described(
                    group_id,
                    ErrorCode.group_id_not_found,
                    None,
                    f"Group {group_id} not found.",
                )
            )
        else:
            out.append(described(group_id, ErrorCode.none, group, None))
    return make(module.DescribeGroupsResponse, throttle_time=_NO_THROTTLE, groups=tuple(out))


async def handle_list_groups(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    states = {s.lower() for s in getattr(request, "states_filter", ())}
    types = {t.lower() for t in getattr(request, "types_filter", ())}
    try:
        stored = await ctx.broker.groups.store.list()
    except IcefloeError as exc:
        return make(
            module.ListGroupsResponse,
            throttle_time=_NO_THROTTLE,
            error_code=store_error(exc),
            groups=(),
        )
    listed = []
    # Without DESCRIBE on the cluster, a client lists only the groups it may describe.
    every = ctx.allows(Operation.DESCRIBE, ResourceType.CLUSTER)
    for s in stored:
        group = s.group
        if (states and group.state_name.lower() not in states) or (
            types and group.type.value not in types
        ):
            continue
        if not every and not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, group.group_id):
            continue
        protocol_type = group.protocol_type or "" if isinstance(group, ClassicGroup) else "consumer"
        listed.append(
            make(
                module.ListedGroup,
                group_id=group.group_id,
                protocol_type=protocol_type,
                group_state=group.state_name,
                group_type=group.type.value,
            )
        )
    return make(
        module.ListGroupsResponse,
        throttle_time=_NO_THROTTLE,
        error_code=ErrorCode.none,
        groups=tuple(listed),
    )


async def handle_delete_groups(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    store = ctx.broker.groups.store

    async def delete(group_id: str) -> ErrorCode:
        while True:
            stored = await store.load(group_id)
            if stored is None:
                return ErrorCode.group_id_not_found
            if not is_empty(stored.group):
                return ErrorCode.non_empty_group
            if await store.delete(group_id, stored):
                return ErrorCode.none

    results = []
    for group_id in request.groups_names:
        if not ctx.allows(Operation.DELETE, ResourceType.GROUP, group_id):
            error = ErrorCode.group_authorization_failed
        else:
            try:
                error = await delete(group_id)
            except IcefloeError as exc:
                error = store_error(exc)
        results.append(make(module.DeletableGroupResult, group_id=group_id, error_code=error))
    return make(module.DeleteGroupsResponse, throttle_time=_NO_THROTTLE, results=tuple(results))
