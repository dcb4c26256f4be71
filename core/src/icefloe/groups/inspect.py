"""What ``icefloe groups`` shows: groups, members, assignments, committed offsets and lag.

Read straight from the metadata store and stream storage, so it works whether brokers run.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from icefloe.groups.consumer_protocol import assigned_partitions
from icefloe.groups.model import ClassicGroup, ClassicState, ConsumerGroup, Group
from icefloe.groups.store import GroupStore
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry


@dataclass(frozen=True, slots=True)
class MemberView:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    assignment: dict[str, tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class PartitionView:
    topic: str
    partition: int
    committed: int | None
    log_end: int | None
    owner: str | None

    @property
    def lag(self) -> int | None:
        """Records not yet consumed; ``None`` without a committed offset or a log end."""
        if self.committed is None or self.log_end is None:
            return None
        return max(0, self.log_end - self.committed)


@dataclass(frozen=True, slots=True)
class GroupView:
    group_id: str
    type: str
    state: str
    epoch: int
    """Generation (classic) or group epoch (consumer)."""
    protocol: str
    """Assignment protocol (classic) or server assignor (consumer)."""
    members: list[MemberView] = field(default_factory=list)
    partitions: list[PartitionView] = field(default_factory=list)


async def list_groups(storage: StreamStorage) -> list[GroupView]:
    """Every group, without members or offsets."""
    return [_summary(s.group) for s in await GroupStore(storage.metadata).list()]


async def describe_group(storage: StreamStorage, group_id: str) -> GroupView | None:
    """One group with its members, their assignments, and offsets and lag per partition."""
    store = GroupStore(storage.metadata)
    stored = await store.load(group_id)
    if stored is None:
        return None
    group = stored.group
    topics = TopicRegistry(storage)
    view = _summary(group)
    view.members.extend(await _members(group, topics))
    owners = {
        (topic, p): m.member_id
        for m in view.members
        for topic, partitions in m.assignment.items()
        for p in partitions
    }
    committed = await store.fetch_offsets(group_id)
    for topic, p in sorted(set(owners) | set(committed)):
        known = await topics.get(topic)
        log_end = (
            await storage.log_end(known.streams[p])
            if known is not None and p < known.partitions
            else None
        )
        offset = committed.get((topic, p))
        view.partitions.append(
            PartitionView(
                topic, p, offset.offset if offset else None, log_end, owners.get((topic, p))
            )
        )
    return view


def _summary(group: Group) -> GroupView:
    if isinstance(group, ClassicGroup):
        protocol = f"{group.protocol_type or ''}/{group.protocol_name or ''}".strip("/")
        return GroupView(group.group_id, "classic", group.state_name, group.generation, protocol)
    return GroupView(
        group.group_id, "consumer", group.state_name, group.group_epoch, group.assignor
    )


async def _members(group: Group, topics: TopicRegistry) -> list[MemberView]:
    if isinstance(group, ConsumerGroup):
        names: dict[uuid.UUID, str] = {info.topic_id: name for name, info in group.topics.items()}
        for topic_id in {t for m in group.members for t in m.assigned}:
            if topic_id not in names:
                known = topics.by_id(topic_id)
                names[topic_id] = known.name if known else str(topic_id)
        return [
            MemberView(
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                {names[t]: tuple(sorted(ps)) for t, ps in sorted(m.assigned.items())},
            )
            for m in group.members
        ]
    readable = group.protocol_type == "consumer" and group.state is ClassicState.STABLE
    return [
        MemberView(
            m.member_id,
            m.instance_id,
            m.client_id,
            m.client_host,
            assigned_partitions(m.assignment) if readable else {},
        )
        for m in group.members
    ]
