"""KIP-848 consumer groups: ConsumerGroupHeartbeat and ConsumerGroupDescribe.

Both versions of each come from kio (0.6.5 has ConsumerGroupHeartbeat v0 and v1; v1 adds the
subscribed topic regex and makes the client generate its member id).
"""

from __future__ import annotations

import base64
import datetime
import uuid
from collections.abc import Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.authorized import NOT_PROVIDED, authorized_operations
from icefloe.broker.handlers.groups import client_host, guarded, may_read
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError
from icefloe.groups import consumer
from icefloe.groups.model import Assignment, ClassicGroup, ConsumerGroup
from icefloe.security.acls import Operation, ResourceType

_NO_THROTTLE = datetime.timedelta(0)


def _kafka_uuid() -> str:
    """A member id as Kafka's coordinator makes them in v0: a URL-safe base64 UUID."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


async def handle_consumer_group_heartbeat(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    coordinator = ctx.broker.groups
    options = coordinator.options

    def answer(result: consumer.HeartbeatResult) -> Any:
        assignment = None
        if result.assignment is not None:
            assignment = make(
                module.Assignment,
                topic_partitions=tuple(
                    make(module.TopicPartitions, topic_id=t, partitions=tuple(sorted(ps)))
                    for t, ps in sorted(result.assignment.items())
                ),
            )
        return make(
            module.ConsumerGroupHeartbeatResponse,
            throttle_time=_NO_THROTTLE,
            error_code=result.error,
            error_message=result.message,
            member_id=result.member_id or None,
            member_epoch=result.member_epoch,
            heartbeat_interval=datetime.timedelta(
                milliseconds=options.consumer_heartbeat_interval_ms
            ),
            assignment=assignment,
        )

    group_id = request.group_id
    member_id = request.member_id
    if not member_id and ctx.api_version == 0 and request.member_epoch == 0:
        member_id = _kafka_uuid()  # v0: the coordinator names new members
    owned: Assignment | None = None
    if request.topic_partitions is not None:
        owned = {
            tp.topic_id: frozenset(int(p) for p in tp.partitions)
            for tp in request.topic_partitions
            if tp.partitions
        }
    rebalance = request.rebalance_timeout
    heartbeat = consumer.HeartbeatRequest(
        member_id=member_id,
        member_epoch=int(request.member_epoch),
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=int(rebalance.total_seconds() * 1000),
        subscribed_topic_names=(
            tuple(request.subscribed_topic_names)
            if request.subscribed_topic_names is not None
            else None
        ),
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor,
        owned=owned,
        client_id=ctx.client_id,
        client_host=client_host(ctx),
    )
    if not group_id:
        return answer(
            consumer.HeartbeatResult(
                ErrorCode.invalid_group_id, "GroupId can't be empty", member_id, -1
            )
        )
    refusal = _refusal(ctx, group_id, heartbeat.subscribed_topic_names or ())
    if refusal is not None:
        return answer(consumer.HeartbeatResult(*refusal, member_id, heartbeat.member_epoch))

    async def run() -> Any:
        # Every member's subscribed names, not only this one's: the assignor sees them all.
        current = await coordinator.store.load(group_id)
        names = set(heartbeat.subscribed_topic_names or ())
        if current is not None and isinstance(current.group, ConsumerGroup):
            names.update(n for m in current.group.members for n in m.subscribed_topic_names)
        catalog = await coordinator.catalog_with(names)
        decision = await coordinator.store.update(
            group_id,
            lambda g, now: consumer.heartbeat(g, group_id, heartbeat, catalog, now, options),
        )
        result = decision.result
        if result.error is ErrorCode.none:
            if result.member_epoch >= 0:
                await coordinator.store.touch(group_id, result.member_id)
            elif result.member_epoch == consumer.LEAVE_EPOCH:
                await coordinator.store.forget(group_id, [result.member_id])
        return answer(result)

    def failed(code: ErrorCode) -> Any:
        return answer(consumer.HeartbeatResult(code, None, member_id, heartbeat.member_epoch))

    return await guarded(failed, run())


def _refusal(
    ctx: RequestContext, group_id: str, topics: Iterable[str]
) -> tuple[ErrorCode, str] | None:
    """Kafka's checks: READ on the group, DESCRIBE on every subscribed topic."""
    if not may_read(ctx, group_id):
        return ErrorCode.group_authorization_failed, f"not allowed to use group {group_id!r}"
    hidden = sorted(t for t in topics if not ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, t))
    if hidden:
        return ErrorCode.topic_authorization_failed, f"not allowed to describe {hidden}"
    return None


async def handle_consumer_group_describe(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    store = ctx.broker.groups.store
    catalog = ctx.broker.groups.catalog()

    with_operations = request.include_authorized_operations

    def group_answer(group_id: str, error: ErrorCode, message: str | None) -> Any:
        return make(
            module.DescribedGroup,
            error_code=error,
            error_message=message,
            group_id=group_id,
            group_state="Dead",
            group_epoch=-1,
            assignment_epoch=-1,
            assignor_name="",
            members=(),
            authorized_operations=NOT_PROVIDED,
        )

    described = []
    for group_id in request.group_ids:
        if not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            message = f"not allowed to describe group {group_id!r}"
            described.append(group_answer(group_id, ErrorCode.group_authorization_failed, message))
            continue
        try:
            stored = await store.load(group_id)
        except IcefloeError as exc:
            described.append(group_answer(group_id, ErrorCode.coordinator_not_available, str(exc)))
            continue
        group = stored.group if stored else None
        if group is None or isinstance(group, ClassicGroup):
            message = (
                f"Group {group_id} not found."
                if group is None
                else f"Group {group_id} is not a consumer group."
            )
            described.append(group_answer(group_id, ErrorCode.group_id_not_found, message))
            continue
        names = {info.topic_id: name for name, info in {**catalog, **group.topics}.items()}

        def assignment(parts: Assignment, names: dict[uuid.UUID, str] = names) -> Any:
            return make(
                module.Assignment,
                topic_partitions=tuple(
                    make(
                        module.TopicPartitions,
                        topic_id=t,
                        topic_name=names.get(t, ""),
                        partitions=tuple(sorted(ps)),
                    )
                    for t, ps in sorted(parts.items())
                ),
            )

        members = tuple(
            make(
                module.Member,
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=m.subscribed_topic_names,
                subscribed_topic_regex=m.subscribed_topic_regex,
                assignment=assignment(m.assigned),
                target_assignment=assignment(group.target.get(m.member_id, {})),
                member_type=1,
            )
            for m in group.members
        )
        described.append(
            make(
                module.DescribedGroup,
                error_code=ErrorCode.none,
                error_message=None,
                group_id=group_id,
                group_state=group.state_name,
                group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=group.assignor,
                members=members,
                authorized_operations=authorized_operations(
                    ctx, with_operations, ResourceType.GROUP, group_id
                ),
            )
        )
    return make(
        module.ConsumerGroupDescribeResponse, throttle_time=_NO_THROTTLE, groups=tuple(described)
    )
