"""The KIP-848 consumer group protocol (ConsumerGroupHeartbeat) as pure functions.

The broker assigns. A change of membership, subscriptions or subscribed topics bumps the
*group epoch*; the assignor then computes a *target assignment* for that epoch. Each member
moves towards its target on its own heartbeats, and never takes a partition another member
still owns:

- if it owns partitions outside its target, it must first revoke them: it stays at its epoch,
  keeps the rest, and is told its reduced assignment (``UNREVOKED_PARTITIONS``); it has its
  rebalance timeout to confirm, by reporting what it owns, or it is fenced;
- then it moves to the target epoch and gets the target partitions that are free; those other
  members still hold come on later heartbeats (``UNRELEASED_PARTITIONS``) until it is
  ``STABLE``;
- each answer that changes what it owns may be lost to it (a client waits one heartbeat
  interval, and the decision stands either way), so its assignment goes out with every answer
  until it reports owning exactly that.

Epoch checks fence zombies: a heartbeat with a greater epoch than the member's, or a smaller
one other than the previous epoch (a lost response), is FENCED_MEMBER_EPOCH and the client
rejoins with epoch 0.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from icefloe.config.groups import GroupOptions
from icefloe.groups.assignors import ASSIGNORS
from icefloe.groups.model import (
    EMPTY_ASSIGNMENT,
    Assignment,
    ClassicGroup,
    ConsumerGroup,
    ConsumerMember,
    Group,
    MemberState,
    TopicInfo,
    is_empty,
)

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat; ``None`` fields did not change since the last heartbeat."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None
    client_id: str = ""
    client_host: str = ""

    @property
    def full(self) -> bool:
        """A join, or a heartbeat carrying everything (clients send one after an error): its
        subscription is topic names or a regex."""
        subscription = self.subscribed_topic_names is not None or bool(self.subscribed_topic_regex)
        return self.member_epoch == 0 or (
            self.rebalance_timeout_ms != -1 and subscription and self.owned is not None
        )


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    error: ErrorCode = ErrorCode.none
    message: str | None = None
    member_id: str = ""
    member_epoch: int = 0
    assignment: Assignment | None = None
    """Sent when it changed or the request was full; ``None`` otherwise."""


def _error(code: ErrorCode, message: str, request: HeartbeatRequest) -> HeartbeatResult:
    return HeartbeatResult(code, message, request.member_id, request.member_epoch)


def heartbeat(
    group: Group | None,
    group_id: str,
    request: HeartbeatRequest,
    catalog: Mapping[str, TopicInfo],
    now: int,
    options: GroupOptions,
) -> tuple[ConsumerGroup | None, HeartbeatResult]:
    """Decide a ConsumerGroupHeartbeat against every topic of the cluster (``catalog``)."""
    if isinstance(group, ClassicGroup):
        if not is_empty(group):
            return None, _error(
                ErrorCode.inconsistent_group_protocol,
                f"group {group_id!r} is a classic group with members; Icefloe converts a group "
                "to the consumer protocol only while it is empty",
                request,
            )
        group = None
    g = group or ConsumerGroup(group_id, assignor=options.consumer_assignors[0])
    invalid = _validate(request, options)
    if invalid is not None:
        return None, invalid

    if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
        return _leave(g, request, catalog, now, options)

    member = g.member(request.member_id)
    if request.member_epoch == 0:
        returning = False
        if request.instance_id is not None:
            static = g.static_member(request.instance_id)
            if static is not None and static.member_id != request.member_id:
                if not static.left:
                    return None, _error(
                        ErrorCode.unreleased_instance_id,
                        f"instance {request.instance_id!r} is in use by another member",
                        request,
                    )
                # A static member coming back: it takes over its old assignment and epoch.
                member = replace(static, member_id=request.member_id, left=False)
                g = _replace_member(g, static.member_id, member)
                g = replace(g, target=_rename(g.target, static.member_id, request.member_id))
                returning = True
        if member is not None and member.left:
            member, returning = replace(member, left=False), True
        if member is not None and not returning:
            # A known member joining again has lost its partitions (it was fenced or reset):
            # start it afresh rather than pretend it still owns what the record says.
            g = _remove(g, {member.member_id}, catalog, now, options)
            member = None
        if member is None:
            member = ConsumerMember(member_id=request.member_id)
    else:
        if member is None or member.left:
            return None, _error(
                ErrorCode.unknown_member_id, f"member {request.member_id!r} is not known", request
            )
        if _fenced(member, request):
            return None, _error(
                ErrorCode.fenced_member_epoch,
                f"epoch {request.member_epoch} is not member epoch {member.member_epoch}",
                request,
            )

    before = g.member(member.member_id)
    updated = _apply_request(member, request, now)
    bump = before is None or _subscription(before) != _subscription(updated)
    g = _put_member(g, updated)
    g = _retarget(g, catalog, options, bump)
    reconciled = _reconcile(g, updated, request.owned, now)
    changed = before is None or before.assigned != reconciled.assigned
    reconciled = replace(reconciled, acknowledged=_acknowledged(reconciled, changed, request))
    g = _put_member(g, reconciled)
    result = HeartbeatResult(
        member_id=reconciled.member_id,
        member_epoch=reconciled.member_epoch,
        assignment=(
            reconciled.assigned if changed or request.full or not reconciled.acknowledged else None
        ),
    )
    if g == group:
        # Nothing changed: liveness alone goes to the member's alive key, never to the record.
        return None, result
    return _put_member(g, replace(reconciled, last_seen_ms=now)), result


def _acknowledged(member: ConsumerMember, changed: bool, request: HeartbeatRequest) -> bool:
    """Whether the member is known to have its assignment: it reported owning exactly that.

    A client waits for an answer only a heartbeat interval (librdkafka's request timeout);
    a slower answer is lost to it though its decision stands, and its next heartbeat, at the
    same epoch and naming nothing it owns, looks like nothing happened. A revocation or the
    partitions released to it since would then never reach it, so its assignment goes out
    with every answer until it reports owning it.
    """
    if request.owned is not None:
        return _same(request.owned, member.assigned)
    return member.acknowledged and not changed


def _validate(request: HeartbeatRequest, options: GroupOptions) -> HeartbeatResult | None:
    if not request.member_id:
        return _error(ErrorCode.invalid_request, "MemberId can't be empty", request)
    if request.member_epoch == 0:
        if request.rebalance_timeout_ms == -1:
            return _error(
                ErrorCode.invalid_request, "RebalanceTimeoutMs must be set on join", request
            )
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            return _error(
                ErrorCode.invalid_request, "a joining member must give its subscription", request
            )
    elif request.member_epoch < STATIC_LEAVE_EPOCH:
        return _error(ErrorCode.invalid_request, "MemberEpoch is invalid", request)
    if request.server_assignor is not None and request.server_assignor not in (
        options.consumer_assignors
    ):
        return _error(
            ErrorCode.unsupported_assignor,
            f"assignor {request.server_assignor!r} is not one of "
            f"{', '.join(options.consumer_assignors)}",
            request,
        )
    if request.subscribed_topic_regex:
        try:
            re.compile(request.subscribed_topic_regex)
        except re.error as exc:
            return _error(ErrorCode.invalid_regular_expression, str(exc), request)
    return None


def _fenced(member: ConsumerMember, request: HeartbeatRequest) -> bool:
    if request.member_epoch > member.member_epoch:
        return True
    if request.member_epoch < member.member_epoch:
        # The response that bumped the epoch may have been lost: the previous epoch is fine if
        # the member owns nothing it should not.
        return (
            request.member_epoch != member.previous_member_epoch
            or request.owned is None
            or not _subset(request.owned, member.assigned)
        )
    return False


def _apply_request(member: ConsumerMember, request: HeartbeatRequest, now: int) -> ConsumerMember:
    return replace(
        member,
        instance_id=request.instance_id if request.instance_id is not None else member.instance_id,
        rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
        client_id=request.client_id,
        client_host=request.client_host,
        subscribed_topic_names=(
            request.subscribed_topic_names
            if request.subscribed_topic_names is not None
            else member.subscribed_topic_names
        ),
        subscribed_topic_regex=(
            (request.subscribed_topic_regex or None)
            if request.subscribed_topic_regex is not None
            else member.subscribed_topic_regex
        ),
        server_assignor=request.server_assignor
        if request.server_assignor is not None
        else member.server_assignor,
        rebalance_timeout_ms=request.rebalance_timeout_ms
        if request.rebalance_timeout_ms != -1
        else member.rebalance_timeout_ms,
    )


def _subscription(m: ConsumerMember) -> tuple[object, ...]:
    return (frozenset(m.subscribed_topic_names), m.subscribed_topic_regex, m.server_assignor)


def _leave(
    g: ConsumerGroup,
    request: HeartbeatRequest,
    catalog: Mapping[str, TopicInfo],
    now: int,
    options: GroupOptions,
) -> tuple[ConsumerGroup | None, HeartbeatResult]:
    member = g.member(request.member_id)
    done = HeartbeatResult(member_id=request.member_id, member_epoch=request.member_epoch)
    if member is None:
        return None, _error(
            ErrorCode.unknown_member_id, f"member {request.member_id!r} is not known", request
        )
    if request.member_epoch == STATIC_LEAVE_EPOCH and member.instance_id is not None:
        # A static member going away for a while keeps its partitions: no rebalance unless it
        # stays away longer than its session.
        return _put_member(g, replace(member, left=True, last_seen_ms=now)), done
    return _remove(g, {member.member_id}, catalog, now, options), done


def advance(
    group: ConsumerGroup,
    alive: Mapping[str, int],
    catalog: Mapping[str, TopicInfo],
    now: int,
    options: GroupOptions,
) -> ConsumerGroup | None:
    """Fence members whose session ended or who did not revoke within their rebalance timeout."""
    gone = {m.member_id for m in group.members if _expiry(m, alive, options) <= now}
    if not gone:
        return None
    return _remove(group, gone, catalog, now, options)


def next_deadline(
    group: ConsumerGroup, alive: Mapping[str, int], options: GroupOptions
) -> int | None:
    return min((_expiry(m, alive, options) for m in group.members), default=None)


def _expiry(member: ConsumerMember, alive: Mapping[str, int], options: GroupOptions) -> int:
    last_seen = max(member.last_seen_ms, alive.get(member.member_id, 0))
    expiry = last_seen + options.consumer_session_timeout_ms
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        expiry = min(expiry, member.revocation_deadline_ms)
    return expiry


def commit_error(group: ConsumerGroup, member_id: str, member_epoch: int) -> ErrorCode:
    """Whether a consumer group accepts an OffsetCommit (or an OffsetFetch naming a member).

    Any epoch but the member's is STALE_MEMBER_EPOCH, as Kafka answers, never
    FENCED_MEMBER_EPOCH (a heartbeat's answer): after the first librdkafka asks for a
    partition's offsets again once it has heartbeated; after the second it gives up on them,
    and the partition does not start until its assignment changes."""
    if member_epoch < 0 and not group.members:
        return ErrorCode.none  # an admin client committing for an empty group
    member = group.member(member_id)
    if member is None:
        return ErrorCode.unknown_member_id
    if member_epoch != member.member_epoch:
        return ErrorCode.stale_member_epoch
    return ErrorCode.none


def txn_commit_error(
    group: ConsumerGroup, member_id: str, instance_id: str | None, member_epoch: int
) -> ErrorCode:
    """Whether a consumer group accepts a TxnOffsetCommit (KIP-447), whose generation field
    carries the member epoch.

    As for OffsetCommit, an empty group accepts a commit without an epoch; so does any group a
    request that names no member, no instance and epoch -1 (TxnOffsetCommit v0-2). Otherwise
    the member must be known and at its current epoch; any other epoch is ILLEGAL_GENERATION,
    the error producers know for this request (Kafka answers STALE_MEMBER_EPOCH only to
    OffsetCommit).
    """
    if member_epoch < 0 and not group.members:
        return ErrorCode.none
    if member_epoch == -1 and not member_id and instance_id is None:
        return ErrorCode.none
    member = group.member(member_id)
    if member is None:
        return ErrorCode.unknown_member_id
    if member.left or member_epoch != member.member_epoch:
        # A static member away (it left with epoch -2) is at no epoch a commit could carry.
        return ErrorCode.illegal_generation
    return ErrorCode.none


# --- assignment -----------------------------------------------------------------------------


def subscribed_topics(
    members: tuple[ConsumerMember, ...], catalog: Mapping[str, TopicInfo]
) -> dict[str, TopicInfo]:
    """The existing topics any member subscribes to, by name or by regex."""
    out: dict[str, TopicInfo] = {}
    for m in members:
        out.update({name: catalog[name] for name in _resolve(m, catalog)})
    return dict(sorted(out.items()))


def _resolve(member: ConsumerMember, catalog: Mapping[str, TopicInfo]) -> frozenset[str]:
    names = {n for n in member.subscribed_topic_names if n in catalog}
    if member.subscribed_topic_regex:
        pattern = re.compile(member.subscribed_topic_regex)
        names |= {n for n in catalog if pattern.fullmatch(n)}
    return frozenset(names)


def _retarget(
    g: ConsumerGroup, catalog: Mapping[str, TopicInfo], options: GroupOptions, bump: bool
) -> ConsumerGroup:
    """Bump the group epoch if membership or the subscribed topics changed, then make sure the
    target assignment is for the current epoch."""
    topics = subscribed_topics(g.members, catalog)
    if bump or topics != g.topics:
        g = replace(g, group_epoch=g.group_epoch + 1, topics=topics)
    if g.assignment_epoch == g.group_epoch:
        return g
    assignor = _choose_assignor(g, options)
    subscriptions = {m.member_id: _resolve(m, catalog) for m in g.members}
    target = ASSIGNORS[assignor](subscriptions, g.topics, g.target)
    return replace(g, assignor=assignor, target=target, assignment_epoch=g.group_epoch)


def _choose_assignor(g: ConsumerGroup, options: GroupOptions) -> str:
    """The assignor most members ask for; the configured default when none asks."""
    votes = Counter(m.server_assignor for m in g.members if m.server_assignor)
    if not votes:
        return options.consumer_assignors[0]
    best = max(votes.values())
    return next(a for a in options.consumer_assignors if votes.get(a) == best)


def _reconcile(
    g: ConsumerGroup, member: ConsumerMember, owned: Assignment | None, now: int
) -> ConsumerMember:
    """Move ``member`` one step towards its target (see the module docstring)."""
    m = member
    if m.state is MemberState.UNREVOKED_PARTITIONS:
        if owned is None or _intersects(owned, m.pending_revocation):
            return m
        m = replace(m, pending_revocation={}, revocation_deadline_ms=0, state=MemberState.STABLE)
    target = g.target.get(m.member_id, EMPTY_ASSIGNMENT)
    if m.member_epoch == g.assignment_epoch and m.state is MemberState.STABLE:
        return m
    keep = _intersection(m.assigned, target)
    revoke = _difference(m.assigned, target)
    if revoke:
        return replace(
            m,
            state=MemberState.UNREVOKED_PARTITIONS,
            assigned=keep,
            pending_revocation=revoke,
            revocation_deadline_ms=now + m.rebalance_timeout_ms,
        )
    held = _union(
        *(o.assigned for o in g.members if o.member_id != m.member_id),
        *(o.pending_revocation for o in g.members if o.member_id != m.member_id),
    )
    assigned = _union(keep, _difference(target, held))
    unreleased = _difference(target, assigned)
    epoch_moves = m.member_epoch != g.assignment_epoch
    return replace(
        m,
        previous_member_epoch=m.member_epoch if epoch_moves else m.previous_member_epoch,
        member_epoch=g.assignment_epoch,
        state=MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE,
        assigned=assigned,
    )


def _remove(
    g: ConsumerGroup,
    gone: set[str],
    catalog: Mapping[str, TopicInfo],
    now: int,
    options: GroupOptions,
) -> ConsumerGroup:
    members = tuple(m for m in g.members if m.member_id not in gone)
    target = {k: v for k, v in g.target.items() if k not in gone}
    g = replace(g, members=members, target=target)
    return _retarget(g, catalog, options, bump=True)


def _put_member(g: ConsumerGroup, member: ConsumerMember) -> ConsumerGroup:
    if g.member(member.member_id) is None:
        return replace(g, members=(*g.members, member))
    return _replace_member(g, member.member_id, member)


def _replace_member(g: ConsumerGroup, member_id: str, member: ConsumerMember) -> ConsumerGroup:
    return replace(g, members=tuple(member if m.member_id == member_id else m for m in g.members))


def _rename(target: Mapping[str, Assignment], old: str, new: str) -> dict[str, Assignment]:
    return {new if k == old else k: v for k, v in target.items()}


# --- assignment set algebra -----------------------------------------------------------------


def _norm(parts: dict[object, frozenset[int]]) -> dict[object, frozenset[int]]:
    return {t: p for t, p in parts.items() if p}


def _intersection(a: Assignment, b: Assignment) -> Assignment:
    return _norm({t: p & b.get(t, frozenset()) for t, p in a.items()})  # type: ignore[return-value]


def _difference(a: Assignment, b: Assignment) -> Assignment:
    return _norm({t: p - b.get(t, frozenset()) for t, p in a.items()})  # type: ignore[return-value]


def _union(*parts: Assignment) -> Assignment:
    out: dict[object, frozenset[int]] = {}
    for a in parts:
        for t, p in a.items():
            out[t] = out.get(t, frozenset()) | p
    return _norm(out)  # type: ignore[return-value]


def _intersects(a: Assignment, b: Assignment) -> bool:
    return any(p & b.get(t, frozenset()) for t, p in a.items())


def _same(a: Assignment, b: Assignment) -> bool:
    return {t: p for t, p in a.items() if p} == {t: p for t, p in b.items() if p}


def _subset(a: Assignment, b: Assignment) -> bool:
    return all(p <= b.get(t, frozenset()) for t, p in a.items())
