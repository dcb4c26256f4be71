"""Group records: what the one metadata key of a group holds, and how it is encoded.

A group is a single record (``groups/<group>``) rather than one key per member: the
transitions of both protocols change several members at once (a classic join completing moves
every member to the new generation; a KIP-848 epoch bump retargets everyone), and one
compare-and-set on one key makes each transition atomic on every metadata store, with or
without multi-key transactions. A member costs a few hundred bytes, so the 1 MiB value limit
allows groups of thousands. Heartbeats do not rewrite the record (see ``keys.ALIVE``), so the
record changes only on real transitions and rarely conflicts.

Records are immutable; transitions return new ones (``dataclasses.replace``).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import msgpack

from icefloe.errors import CorruptDataError

FORMAT_VERSION: Final = 1

Assignment = Mapping[uuid.UUID, frozenset[int]]
"""Partitions by topic id. Empty partition sets are never stored."""

EMPTY_ASSIGNMENT: Final[Assignment] = {}


class GroupType(enum.StrEnum):
    CLASSIC = "classic"
    CONSUMER = "consumer"


class ClassicState(enum.StrEnum):
    """Kafka's classic group states, spelled as Kafka reports them."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"


class MemberState(enum.StrEnum):
    """Where a KIP-848 member is in reaching its target assignment."""

    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    """Must give up partitions before it may move to the new epoch."""
    UNRELEASED_PARTITIONS = "unreleased_partitions"
    """At the new epoch, waiting for partitions other members still hold."""


@dataclass(frozen=True, slots=True)
class ClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    """(name, metadata) in the member's order of preference."""
    assignment: bytes = b""
    joined: bool = False
    """Has (re)joined the rebalance in progress; meaningless outside PreparingRebalance."""
    last_seen_ms: int = 0
    """When a request from this member last changed the record (heartbeats: ``keys.ALIVE``)."""

    def metadata_for(self, protocol: str) -> bytes:
        return next(metadata for name, metadata in self.protocols if name == protocol)


@dataclass(frozen=True, slots=True)
class ClassicGroup:
    group_id: str
    state: ClassicState = ClassicState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: tuple[ClassicMember, ...] = ()
    """In join order: the first member becomes leader when the old one did not rejoin."""
    pending: tuple[tuple[str, int], ...] = ()
    """Member ids handed out with MEMBER_ID_REQUIRED, with the time they lapse."""
    deadline_ms: int = 0
    """PreparingRebalance: the join completes by then with whoever joined.
    CompletingRebalance: the leader must have sent its assignment by then."""
    join_ready_ms: int = 0
    """PreparingRebalance: the join may not complete earlier (the initial delay)."""
    join_cap_ms: int = 0
    """PreparingRebalance of an empty group: when the initial delay ends, however many members
    keep arriving."""

    type: ClassVar[GroupType] = GroupType.CLASSIC

    @property
    def state_name(self) -> str:
        return self.state.value

    def member(self, member_id: str) -> ClassicMember | None:
        return next((m for m in self.members if m.member_id == member_id), None)

    def static_member(self, instance_id: str) -> ClassicMember | None:
        return next((m for m in self.members if m.instance_id == instance_id), None)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What an assignor needs to know of a topic."""

    topic_id: uuid.UUID
    partitions: int


@dataclass(frozen=True, slots=True)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    rebalance_timeout_ms: int = 0
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Assignment = field(default_factory=dict)
    """Partitions the member owns and may consume now."""
    pending_revocation: Assignment = field(default_factory=dict)
    """Partitions the member must give up; still its own (nobody else gets them) until then."""
    revocation_deadline_ms: int = 0
    last_seen_ms: int = 0
    left: bool = False
    """A static member that left with epoch -2: it keeps its partitions until its session ends."""
    acknowledged: bool = False
    """The member reported owning exactly ``assigned``: until it does, every heartbeat answer
    carries its assignment (the answer that first did may never have reached it)."""


@dataclass(frozen=True, slots=True)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    assignor: str = "uniform"
    members: tuple[ConsumerMember, ...] = ()
    target: Mapping[str, Assignment] = field(default_factory=dict)
    """Target assignment of ``assignment_epoch``, by member id."""
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    """Subscribed topics as they were when ``group_epoch`` was last bumped."""

    type: ClassVar[GroupType] = GroupType.CONSUMER

    @property
    def state_name(self) -> str:
        """Kafka's consumer group state: Empty, Assigning, Reconciling or Stable."""
        if not self.members:
            return "Empty"
        if self.assignment_epoch < self.group_epoch:
            return "Assigning"
        if any(
            m.member_epoch != self.assignment_epoch or m.state is not MemberState.STABLE
            for m in self.members
        ):
            return "Reconciling"
        return "Stable"

    def member(self, member_id: str) -> ConsumerMember | None:
        return next((m for m in self.members if m.member_id == member_id), None)

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        return next((m for m in self.members if m.instance_id == instance_id), None)


Group = ClassicGroup | ConsumerGroup


def is_empty(group: Group) -> bool:
    return not group.members


# --- encoding -----------------------------------------------------------------------------


def encode(group: Group) -> bytes:
    """The record's bytes (msgpack, with a format version)."""
    if isinstance(group, ClassicGroup):
        body: dict[str, Any] = {
            "state": group.state.value,
            "generation": group.generation,
            "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name,
            "leader": group.leader,
            "members": [_classic_member(m) for m in group.members],
            "pending": [list(p) for p in group.pending],
            "deadline_ms": group.deadline_ms,
            "join_ready_ms": group.join_ready_ms,
            "join_cap_ms": group.join_cap_ms,
        }
    else:
        body = {
            "group_epoch": group.group_epoch,
            "assignment_epoch": group.assignment_epoch,
            "assignor": group.assignor,
            "members": [_consumer_member(m) for m in group.members],
            "target": {member: _assignment(a) for member, a in group.target.items()},
            "topics": {
                name: [info.topic_id.bytes, info.partitions] for name, info in group.topics.items()
            },
        }
    payload = {"v": FORMAT_VERSION, "type": group.type.value, "id": group.group_id, **body}
    return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]


def decode(value: bytes) -> Group:
    """The record encoded by :func:`encode`.

    Raises:
        CorruptDataError: the bytes are not a group record of a known format version.
    """
    try:
        p = msgpack.unpackb(value, raw=False)
        if p["v"] != FORMAT_VERSION:
            raise CorruptDataError(f"group record format {p['v']} is not {FORMAT_VERSION}")
        if p["type"] == GroupType.CLASSIC:
            return ClassicGroup(
                group_id=p["id"],
                state=ClassicState(p["state"]),
                generation=p["generation"],
                protocol_type=p["protocol_type"],
                protocol_name=p["protocol_name"],
                leader=p["leader"],
                members=tuple(_read_classic_member(m) for m in p["members"]),
                pending=tuple((member, until) for member, until in p["pending"]),
                deadline_ms=p["deadline_ms"],
                join_ready_ms=p["join_ready_ms"],
                join_cap_ms=p.get("join_cap_ms", 0),
            )
        return ConsumerGroup(
            group_id=p["id"],
            group_epoch=p["group_epoch"],
            assignment_epoch=p["assignment_epoch"],
            assignor=p["assignor"],
            members=tuple(_read_consumer_member(m) for m in p["members"]),
            target={member: _read_assignment(a) for member, a in p["target"].items()},
            topics={
                name: TopicInfo(uuid.UUID(bytes=topic_id), partitions)
                for name, (topic_id, partitions) in p["topics"].items()
            },
        )
    except CorruptDataError:
        raise
    except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"undecodable group record: {exc}") from exc


def _assignment(assignment: Assignment) -> list[list[Any]]:
    return [[topic.bytes, sorted(parts)] for topic, parts in assignment.items() if parts]


def _read_assignment(value: list[list[Any]]) -> dict[uuid.UUID, frozenset[int]]:
    return {uuid.UUID(bytes=topic): frozenset(parts) for topic, parts in value}


def _classic_member(m: ClassicMember) -> list[Any]:
    return [
        m.member_id,
        m.instance_id,
        m.client_id,
        m.client_host,
        m.session_timeout_ms,
        m.rebalance_timeout_ms,
        m.protocol_type,
        [list(p) for p in m.protocols],
        m.assignment,
        m.joined,
        m.last_seen_ms,
    ]


def _read_classic_member(v: list[Any]) -> ClassicMember:
    return ClassicMember(
        member_id=v[0],
        instance_id=v[1],
        client_id=v[2],
        client_host=v[3],
        session_timeout_ms=v[4],
        rebalance_timeout_ms=v[5],
        protocol_type=v[6],
        protocols=tuple((name, metadata) for name, metadata in v[7]),
        assignment=v[8],
        joined=v[9],
        last_seen_ms=v[10],
    )


def _consumer_member(m: ConsumerMember) -> dict[str, Any]:
    return {
        "id": m.member_id,
        "instance": m.instance_id,
        "rack": m.rack_id,
        "client": m.client_id,
        "host": m.client_host,
        "names": list(m.subscribed_topic_names),
        "regex": m.subscribed_topic_regex,
        "assignor": m.server_assignor,
        "rebalance_ms": m.rebalance_timeout_ms,
        "epoch": m.member_epoch,
        "prev_epoch": m.previous_member_epoch,
        "state": m.state.value,
        "assigned": _assignment(m.assigned),
        "revoking": _assignment(m.pending_revocation),
        "revoke_by": m.revocation_deadline_ms,
        "seen": m.last_seen_ms,
        "left": m.left,
        "acked": m.acknowledged,
    }


def _read_consumer_member(v: dict[str, Any]) -> ConsumerMember:
    return ConsumerMember(
        member_id=v["id"],
        instance_id=v["instance"],
        rack_id=v["rack"],
        client_id=v["client"],
        client_host=v["host"],
        subscribed_topic_names=tuple(v["names"]),
        subscribed_topic_regex=v["regex"],
        server_assignor=v["assignor"],
        rebalance_timeout_ms=v["rebalance_ms"],
        member_epoch=v["epoch"],
        previous_member_epoch=v["prev_epoch"],
        state=MemberState(v["state"]),
        assigned=_read_assignment(v["assigned"]),
        pending_revocation=_read_assignment(v["revoking"]),
        revocation_deadline_ms=v["revoke_by"],
        last_seen_ms=v["seen"],
        left=v["left"],
        acknowledged=v.get("acked", True),  # records written before the field: as before
    )
