"""The classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) as pure functions.

Each function takes the group record as read, the request, and the time, and returns the record
to write (``None``: nothing changes) with what to answer. Nothing here does I/O, so the
persistence layer can re-run a decision after losing a compare-and-set, and any broker can make
it. Assignment is client-side, as in Kafka: the leader's SyncGroup carries every member's
assignment and the broker only hands them out.

A rebalance: the group moves to PreparingRebalance; every member learns it from its heartbeat
and rejoins; once all have rejoined (and, for a group that was empty, the initial delay has
passed) or the rebalance deadline is reached, the join completes: a new generation, a chosen
protocol and leader, members that did not rejoin dropped (CompletingRebalance). The leader's
SyncGroup then stores the assignments (Stable).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from kio.schema.errors import ErrorCode

from icefloe.config.groups import GroupOptions
from icefloe.groups.model import ClassicGroup, ClassicMember, ClassicState, Group, is_empty

# --- requests and outcomes ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JoinRequest:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool
    """JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED and its id."""


@dataclass(frozen=True, slots=True)
class JoinError:
    """Answer now with this error (MEMBER_ID_REQUIRED carries the member's new id)."""

    error: ErrorCode
    member_id: str = ""


@dataclass(frozen=True, slots=True)
class JoinNow:
    """Answer now with the group's current generation."""

    member_id: str


@dataclass(frozen=True, slots=True)
class JoinWait:
    """The member has joined the rebalance; answer once a generation after ``after`` exists."""

    member_id: str
    after: int


JoinOutcome = JoinError | JoinNow | JoinWait


@dataclass(frozen=True, slots=True)
class SyncError:
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class SyncNow:
    assignment: bytes


@dataclass(frozen=True, slots=True)
class SyncWait:
    """A follower waits for the leader's assignment of ``generation``."""

    generation: int


SyncOutcome = SyncError | SyncNow | SyncWait


# --- JoinGroup ------------------------------------------------------------------------------


def join(
    group: Group | None,
    group_id: str,
    request: JoinRequest,
    now: int,
    options: GroupOptions,
    new_member_id: str,
) -> tuple[ClassicGroup | None, JoinOutcome]:
    """Decide a JoinGroup. ``new_member_id`` is the id a new member gets (made by the caller)."""
    if (
        not options.min_session_timeout_ms
        <= request.session_timeout_ms
        <= (options.max_session_timeout_ms)
    ):
        return None, JoinError(ErrorCode.invalid_session_timeout)
    if not request.protocol_type or not request.protocols:
        return None, JoinError(ErrorCode.inconsistent_group_protocol)
    if group is not None and not isinstance(group, ClassicGroup):
        if not is_empty(group):
            # Icefloe converts a group between protocols only while it is empty.
            return None, JoinError(ErrorCode.inconsistent_group_protocol)
        group = None
    g = _without_lapsed_pending(group or ClassicGroup(group_id), now)
    if g.members and not _compatible(g, request):
        return None, JoinError(ErrorCode.inconsistent_group_protocol)

    if not request.member_id:
        if request.instance_id is not None:
            known = g.static_member(request.instance_id)
            if known is not None:
                return _replace_static_member(g, known, request, new_member_id, now, options)
            return _add_member(g, request, new_member_id, now, options)
        if request.require_known_member_id:
            pending = (*g.pending, (new_member_id, now + request.session_timeout_ms))
            return replace(g, pending=pending), JoinError(
                ErrorCode.member_id_required, new_member_id
            )
        return _add_member(g, request, new_member_id, now, options)

    member = g.member(request.member_id)
    if member is None:
        if request.instance_id is not None and g.static_member(request.instance_id) is not None:
            return None, JoinError(ErrorCode.fenced_instance_id)
        if any(pending_id == request.member_id for pending_id, _ in g.pending):
            g = replace(g, pending=tuple(p for p in g.pending if p[0] != request.member_id))
            return _add_member(g, request, request.member_id, now, options)
        return None, JoinError(ErrorCode.unknown_member_id)
    if _fenced(g, request.member_id, request.instance_id):
        return None, JoinError(ErrorCode.fenced_instance_id)
    return _rejoin(g, member, request, now, options)


def _compatible(group: ClassicGroup, request: JoinRequest) -> bool:
    """Same protocol type, and some protocol every member (the newcomer included) supports."""
    if request.protocol_type != group.protocol_type:
        return False
    offered = {name for name, _ in request.protocols}
    return bool(offered & _common_protocols(group.members))


def _common_protocols(members: Iterable[ClassicMember]) -> set[str]:
    sets = [{name for name, _ in m.protocols} for m in members]
    return set.intersection(*sets) if sets else set()


def _updated(member: ClassicMember, request: JoinRequest, now: int) -> ClassicMember:
    return replace(
        member,
        client_id=request.client_id,
        client_host=request.client_host,
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        protocol_type=request.protocol_type,
        protocols=request.protocols,
        joined=True,
        last_seen_ms=now,
    )


def _add_member(
    g: ClassicGroup, request: JoinRequest, member_id: str, now: int, options: GroupOptions
) -> tuple[ClassicGroup, JoinOutcome]:
    member = ClassicMember(
        member_id=member_id,
        instance_id=request.instance_id,
        client_id=request.client_id,
        client_host=request.client_host,
        session_timeout_ms=request.session_timeout_ms,
        rebalance_timeout_ms=request.rebalance_timeout_ms,
        protocol_type=request.protocol_type,
        protocols=request.protocols,
        joined=True,
        last_seen_ms=now,
    )
    before = g.generation
    g = replace(g, protocol_type=request.protocol_type, members=(*g.members, member))
    if g.state is not ClassicState.PREPARING_REBALANCE:
        g = _prepare_rebalance(g, now, options, joined={member_id})
    elif now < g.join_cap_ms:
        # Members are still arriving at a new group: wait until they stop, within the cap.
        g = replace(g, join_ready_ms=min(g.join_cap_ms, now + options.initial_rebalance_quiet_ms))
    return _maybe_complete_join(g, now), JoinWait(member_id, before)


def _rejoin(
    g: ClassicGroup,
    member: ClassicMember,
    request: JoinRequest,
    now: int,
    options: GroupOptions,
) -> tuple[ClassicGroup | None, JoinOutcome]:
    unchanged = member.protocols == request.protocols
    if g.state is ClassicState.COMPLETING_REBALANCE and unchanged:
        # A retried JoinGroup (the response was lost): answer with the generation it joined.
        return None, JoinNow(member.member_id)
    if g.state is ClassicState.STABLE and unchanged and member.member_id != g.leader:
        return None, JoinNow(member.member_id)
    before = g.generation
    g = _with_member(g, _updated(member, request, now))
    if g.state is not ClassicState.PREPARING_REBALANCE:
        # The leader rejoining means it wants to assign again (e.g. its metadata changed).
        g = _prepare_rebalance(g, now, options, joined={member.member_id})
    return _maybe_complete_join(g, now), JoinWait(member.member_id, before)


def _replace_static_member(
    g: ClassicGroup,
    old: ClassicMember,
    request: JoinRequest,
    new_member_id: str,
    now: int,
    options: GroupOptions,
) -> tuple[ClassicGroup, JoinOutcome]:
    """A static member restarted: it takes over its old identity and assignment (KIP-345).

    When nothing it subscribes to changed and it is not the leader, it gets its old assignment
    back without a rebalance: that is the point of static membership. The old member id is
    fenced from now on.
    """
    new = replace(_updated(old, request, now), member_id=new_member_id, joined=False)
    leader = new_member_id if g.leader == old.member_id else g.leader
    g = replace(
        g,
        members=tuple(new if m.member_id == old.member_id else m for m in g.members),
        leader=leader,
    )
    if (
        g.state is ClassicState.STABLE
        and old.protocols == request.protocols
        and leader != new_member_id  # a leader must be able to assign again
    ):
        return g, JoinNow(new_member_id)
    before = g.generation
    if g.state is not ClassicState.PREPARING_REBALANCE:
        g = _prepare_rebalance(g, now, options, set())
    g = _with_member(g, replace(new, joined=True))
    return _maybe_complete_join(g, now), JoinWait(new_member_id, before)


def join_result(group: Group | None, member_id: str, after: int) -> ErrorCode | None:
    """For a member waiting on its join: ``NONE`` when a generation after ``after`` exists,
    an error if the member is gone, ``None`` to keep waiting."""
    if not isinstance(group, ClassicGroup) or group.member(member_id) is None:
        return ErrorCode.unknown_member_id
    if group.generation > after:
        # If yet another rebalance has begun, the member learns it from SyncGroup.
        return ErrorCode.none
    return None


def join_members(group: ClassicGroup, member_id: str) -> list[tuple[str, str | None, bytes]]:
    """What a JoinGroup response lists: every member's metadata for the leader, else nothing."""
    if member_id != group.leader or group.protocol_name is None:
        return []
    protocol = group.protocol_name
    return [(m.member_id, m.instance_id, m.metadata_for(protocol)) for m in group.members]


# --- SyncGroup ------------------------------------------------------------------------------


def sync(
    group: Group | None,
    member_id: str,
    instance_id: str | None,
    generation: int,
    protocol_type: str | None,
    protocol_name: str | None,
    assignments: Mapping[str, bytes],
    now: int,
) -> tuple[ClassicGroup | None, SyncOutcome]:
    """Decide a SyncGroup: the leader's stores every assignment; followers wait for it."""
    error = _member_error(group, member_id, instance_id)
    if error is not None:
        return None, SyncError(error)
    assert isinstance(group, ClassicGroup)
    if generation != group.generation:
        return None, SyncError(ErrorCode.illegal_generation)
    if (protocol_type is not None and protocol_type != group.protocol_type) or (
        protocol_name is not None and protocol_name != group.protocol_name
    ):
        return None, SyncError(ErrorCode.inconsistent_group_protocol)
    if group.state is ClassicState.PREPARING_REBALANCE:
        return None, SyncError(ErrorCode.rebalance_in_progress)
    member = group.member(member_id)
    assert member is not None
    if group.state is ClassicState.STABLE:
        return None, SyncNow(member.assignment)
    if member_id != group.leader:
        return None, SyncWait(generation)
    members = tuple(
        replace(m, assignment=assignments.get(m.member_id, b""), last_seen_ms=now)
        if m.member_id == member_id
        else replace(m, assignment=assignments.get(m.member_id, b""))
        for m in group.members
    )
    stable = replace(group, state=ClassicState.STABLE, members=members, deadline_ms=0)
    return stable, SyncNow(assignments.get(member_id, b""))


def sync_result(group: Group | None, member_id: str, generation: int) -> SyncOutcome | None:
    """For a follower waiting on the leader: its assignment, an error, or ``None`` to wait."""
    if not isinstance(group, ClassicGroup):
        return SyncError(ErrorCode.unknown_member_id)
    member = group.member(member_id)
    if member is None:
        return SyncError(ErrorCode.unknown_member_id)
    if group.generation != generation or group.state is ClassicState.PREPARING_REBALANCE:
        return SyncError(ErrorCode.rebalance_in_progress)
    if group.state is ClassicState.STABLE:
        return SyncNow(member.assignment)
    return None


# --- Heartbeat, LeaveGroup, OffsetCommit checks ---------------------------------------------


def heartbeat(
    group: Group | None, member_id: str, instance_id: str | None, generation: int
) -> ErrorCode:
    """What a Heartbeat is answered (heartbeats change no record; see ``keys.ALIVE``)."""
    error = _member_error(group, member_id, instance_id)
    if error is not None:
        return error
    assert isinstance(group, ClassicGroup)
    if generation != group.generation:
        return ErrorCode.illegal_generation
    if group.state is ClassicState.PREPARING_REBALANCE:
        return ErrorCode.rebalance_in_progress
    return ErrorCode.none


def leave(
    group: Group | None,
    leaving: Iterable[tuple[str, str | None]],
    now: int,
    options: GroupOptions,
) -> tuple[ClassicGroup | None, list[ErrorCode]]:
    """Remove members given as (member id, instance id); one error code per member."""
    errors: list[ErrorCode] = []
    if not isinstance(group, ClassicGroup):
        return None, [ErrorCode.unknown_member_id for _ in leaving]
    gone: set[str] = set()
    for member_id, instance_id in leaving:
        if instance_id is not None:
            member = group.static_member(instance_id)
            if member is None:
                errors.append(ErrorCode.unknown_member_id)
                continue
            if member_id and member.member_id != member_id:
                errors.append(ErrorCode.fenced_instance_id)
                continue
        else:
            member = group.member(member_id)
            if member is None:
                errors.append(ErrorCode.unknown_member_id)
                continue
        gone.add(member.member_id)
        errors.append(ErrorCode.none)
    if not gone:
        return None, errors
    return _after_removal(group, gone, now, options), errors


def commit_error(
    group: Group | None, member_id: str, instance_id: str | None, generation: int
) -> ErrorCode:
    """Whether a classic group accepts an OffsetCommit (Kafka's rules, by generation).

    A commit with a negative generation and no member comes from an admin client or a consumer
    that assigns partitions itself: accepted while the group is empty (or absent).
    """
    if group is None:
        return ErrorCode.none if generation < 0 else ErrorCode.illegal_generation
    assert isinstance(group, ClassicGroup)
    if generation < 0 and group.state is ClassicState.EMPTY:
        return ErrorCode.none
    if generation >= 0 or member_id or instance_id is not None:
        error = _member_error(group, member_id, instance_id)
        if error is not None:
            return error
        if generation != group.generation:
            return ErrorCode.illegal_generation
    elif group.state is not ClassicState.EMPTY:
        return ErrorCode.unknown_member_id
    if group.state is ClassicState.COMPLETING_REBALANCE:
        return ErrorCode.rebalance_in_progress
    return ErrorCode.none


def txn_commit_error(
    group: ClassicGroup | None, member_id: str, instance_id: str | None, generation: int
) -> ErrorCode:
    """Whether a classic group accepts a TxnOffsetCommit (KIP-447): OffsetCommit's rules, except
    that a request naming no member, generation or instance (TxnOffsetCommit v0-2, a producer
    that knows nothing of the group) is accepted in any state, and that a rebalance in progress
    refuses nothing: the transaction is what fences a commit then.

    A member the group no longer knows gets UNKNOWN_MEMBER_ID, an old generation
    ILLEGAL_GENERATION, a static instance taken over by another member FENCED_INSTANCE_ID; a
    group that does not exist accepts only a commit without a generation.
    """
    if group is None:
        return ErrorCode.none if generation < 0 else ErrorCode.illegal_generation
    if generation < 0 and group.state is ClassicState.EMPTY:
        return ErrorCode.none
    if generation < 0 and not member_id and instance_id is None:
        return ErrorCode.none
    error = _member_error(group, member_id, instance_id)
    if error is not None:
        return error
    if generation != group.generation:
        return ErrorCode.illegal_generation
    return ErrorCode.none


def _member_error(group: Group | None, member_id: str, instance_id: str | None) -> ErrorCode | None:
    if not isinstance(group, ClassicGroup):
        return ErrorCode.unknown_member_id
    if _fenced(group, member_id, instance_id):
        return ErrorCode.fenced_instance_id
    if group.member(member_id) is None:
        return ErrorCode.unknown_member_id
    return None


def _fenced(group: ClassicGroup, member_id: str, instance_id: str | None) -> bool:
    """A static instance now known by another member id: this one is a zombie."""
    if instance_id is None:
        return False
    current = group.static_member(instance_id)
    return current is not None and current.member_id != member_id


# --- timers ---------------------------------------------------------------------------------


def advance(
    group: ClassicGroup, alive: Mapping[str, int], now: int, options: GroupOptions
) -> ClassicGroup | None:
    """Apply every timer that is due: session expiry, join completion, a leader that never
    synced, lapsed pending member ids. ``alive`` holds heartbeat times by member id."""
    g = _without_lapsed_pending(group, now)
    expired = {m.member_id for m in g.members if _expiry(g, m, alive) <= now}
    if expired:
        g = _after_removal(g, expired, now, options)
    if g.state is ClassicState.PREPARING_REBALANCE and now >= g.deadline_ms:
        g = _complete_join(g, now)
    else:
        g = _maybe_complete_join(g, now)
    if g.state is ClassicState.COMPLETING_REBALANCE and now >= g.deadline_ms:
        g = _prepare_rebalance(g, now, options, set())
    return None if g == group else g


def next_deadline(group: ClassicGroup, alive: Mapping[str, int]) -> int | None:
    """When :func:`advance` may next have something to do, if ever."""
    times = [until for _, until in group.pending]
    times += [_expiry(group, m, alive) for m in group.members]
    if group.state is ClassicState.PREPARING_REBALANCE:
        times.append(group.deadline_ms)
        if all(m.joined for m in group.members):
            times.append(group.join_ready_ms)
    elif group.state is ClassicState.COMPLETING_REBALANCE:
        times.append(group.deadline_ms)
    finite = [t for t in times if t < _NEVER]
    return min(finite) if finite else None


_NEVER = 1 << 62


def _expiry(group: ClassicGroup, member: ClassicMember, alive: Mapping[str, int]) -> int:
    # As in Kafka, a member waiting for its JoinGroup answer is kept alive: the rebalance
    # deadline bounds that wait instead. A member with its JoinGroup answer must sync or
    # heartbeat within its session, or a leader that vanished right after the join would hold
    # every follower until the sync deadline; followers waiting for the leader's assignment are
    # kept alive by the broker serving their SyncGroup (``keys.ALIVE``).
    if group.state is ClassicState.PREPARING_REBALANCE and member.joined:
        return _NEVER
    last_seen = max(member.last_seen_ms, alive.get(member.member_id, 0))
    return last_seen + member.session_timeout_ms


# --- shared steps ---------------------------------------------------------------------------


def _with_member(g: ClassicGroup, member: ClassicMember) -> ClassicGroup:
    return replace(
        g, members=tuple(member if m.member_id == member.member_id else m for m in g.members)
    )


def _without_lapsed_pending(g: ClassicGroup, now: int) -> ClassicGroup:
    kept = tuple(p for p in g.pending if p[1] > now)
    return g if kept == g.pending else replace(g, pending=kept)


def _prepare_rebalance(
    g: ClassicGroup, now: int, options: GroupOptions, joined: set[str]
) -> ClassicGroup:
    was_empty = g.state is ClassicState.EMPTY
    members = tuple(replace(m, joined=m.member_id in joined) for m in g.members)
    cap = now + options.initial_rebalance_delay_ms if was_empty else 0
    return replace(
        g,
        state=ClassicState.PREPARING_REBALANCE,
        members=members,
        deadline_ms=now + max((m.rebalance_timeout_ms for m in members), default=0),
        join_ready_ms=min(cap, now + options.initial_rebalance_quiet_ms) if was_empty else now,
        join_cap_ms=cap,
    )


def _maybe_complete_join(g: ClassicGroup, now: int) -> ClassicGroup:
    if (
        g.state is ClassicState.PREPARING_REBALANCE
        and all(m.joined for m in g.members)
        and now >= g.join_ready_ms
    ):
        return _complete_join(g, now)
    return g


def _complete_join(g: ClassicGroup, now: int) -> ClassicGroup:
    """End the join phase: members that did not rejoin are dropped, a new generation begins."""
    members = tuple(
        replace(m, joined=False, assignment=b"", last_seen_ms=now) for m in g.members if m.joined
    )
    if not members:
        return _emptied(g)
    ids = {m.member_id for m in members}
    return replace(
        g,
        state=ClassicState.COMPLETING_REBALANCE,
        generation=g.generation + 1,
        protocol_type=members[0].protocol_type,
        protocol_name=_select_protocol(members),
        leader=g.leader if g.leader in ids else members[0].member_id,
        members=members,
        deadline_ms=now + max(m.rebalance_timeout_ms for m in members),
        join_ready_ms=0,
        join_cap_ms=0,
    )


def _after_removal(
    g: ClassicGroup, gone: set[str], now: int, options: GroupOptions
) -> ClassicGroup:
    g = replace(g, members=tuple(m for m in g.members if m.member_id not in gone))
    if not g.members:
        return _emptied(g)
    if g.state is ClassicState.PREPARING_REBALANCE:
        return _maybe_complete_join(g, now)
    return _prepare_rebalance(g, now, options, set())


def _emptied(g: ClassicGroup) -> ClassicGroup:
    # Kafka bumps the generation when the last member goes, so that late commits of the old
    # generation are refused.
    return replace(
        g,
        state=ClassicState.EMPTY,
        generation=g.generation + 1,
        protocol_name=None,
        leader=None,
        members=(),
        deadline_ms=0,
        join_ready_ms=0,
        join_cap_ms=0,
    )


def _select_protocol(members: tuple[ClassicMember, ...]) -> str:
    """The protocol every member supports that most members prefer (Kafka's vote).

    Ties go to the protocol the first member prefers, so the choice is deterministic.
    """
    common = _common_protocols(members)
    votes = Counter(next(name for name, _ in m.protocols if name in common) for m in members)
    best = max(votes.values())
    return next(name for name, _ in members[0].protocols if votes.get(name) == best)
