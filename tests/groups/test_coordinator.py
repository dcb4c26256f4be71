"""Leases and timers: two coordinators (as two broker processes) on one real SQLite store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from icefloe.cluster import Cluster
from icefloe.config.groups import GroupOptions
from icefloe.groups.coordinator import GroupCoordinator, read_lease
from icefloe.groups.model import ClassicGroup, ClassicMember, ClassicState
from icefloe.groups.store import now_ms
from icefloe.ports.metadata import MetadataStore
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry

TTL = 0.5


@dataclass
class Node:
    metadata: MetadataStore
    cluster: Cluster
    topics: TopicRegistry
    groups: GroupCoordinator

    async def stop(self) -> None:
        await self.groups.stop()
        await self.cluster.leave()
        await self.topics.close()


async def start_node(storage: StreamStorage, port: int) -> Node:
    cluster = Cluster(storage.metadata, TTL)
    topics = TopicRegistry(storage)
    await topics.start()
    await cluster.join("127.0.0.1", port, None, None)
    groups = GroupCoordinator(storage.metadata, cluster, topics, GroupOptions(), TTL)
    await groups.start()
    return Node(storage.metadata, cluster, topics, groups)


@pytest.fixture
async def nodes(storage: StreamStorage, other_storage: StreamStorage) -> AsyncIterator[list[Node]]:
    started = [await start_node(storage, 9001), await start_node(other_storage, 9002)]
    yield started
    for node in started:
        await node.stop()


def member(member_id: str, session_ms: int, last_seen: int) -> ClassicMember:
    return ClassicMember(
        member_id,
        None,
        "app",
        "/h",
        session_ms,
        60_000,
        "consumer",
        (("range", b""),),
        last_seen_ms=last_seen,
    )


async def put_stable_group(node: Node, *members: ClassicMember) -> None:
    group = ClassicGroup(
        "g", ClassicState.STABLE, 1, "consumer", "range", members[0].member_id, members
    )
    await node.groups.store.update("g", lambda current, now: (group, None))


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Wait (up to 10 s) for ``check`` to hold."""
    deadline = time.monotonic() + 10
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_one_broker_takes_the_lease_of_a_group_with_members(nodes: list[Node]) -> None:
    await put_stable_group(nodes[0], member("m", 60_000, now_ms()))

    async def leased() -> bool:
        return any("g" in n.groups.held for n in nodes)

    await eventually(leased)
    assert sum("g" in n.groups.held for n in nodes) == 1
    lease = await read_lease(nodes[0].metadata, "g")
    assert lease is not None
    holder = next(n for n in nodes if "g" in n.groups.held)
    assert holder.cluster.me is not None
    assert lease.node_id == holder.cluster.me.node_id


async def test_lease_holder_removes_a_silent_member(nodes: list[Node]) -> None:
    await put_stable_group(
        nodes[0], member("quiet", 300, now_ms()), member("busy", 60_000, now_ms())
    )

    async def removed() -> bool:
        stored = await nodes[0].groups.store.load("g")
        return stored is not None and [m.member_id for m in stored.group.members] == ["busy"]

    await eventually(removed)


async def test_timers_move_to_another_broker_when_the_holder_goes(nodes: list[Node]) -> None:
    await put_stable_group(nodes[0], member("m", 60_000, now_ms()))

    async def leased() -> bool:
        return any("g" in n.groups.held for n in nodes)

    await eventually(leased)
    holder = next(n for n in nodes if "g" in n.groups.held)
    survivor = next(n for n in nodes if n is not holder)
    await holder.stop()
    nodes.remove(holder)

    async def moved() -> bool:
        return "g" in survivor.groups.held

    await eventually(moved)
    # And the survivor runs the group's timers: a member that goes silent is removed.
    await survivor.groups.store.touch("g", "m")
    quiet = member("late", 200, now_ms())
    stored = await survivor.groups.store.load("g")
    assert stored is not None
    assert isinstance(stored.group, ClassicGroup)
    await put_stable_group(survivor, *stored.group.members, quiet)

    async def removed() -> bool:
        stored = await survivor.groups.store.load("g")
        return stored is not None and "late" not in {m.member_id for m in stored.group.members}

    await eventually(removed)


async def test_lease_is_released_when_the_group_empties(nodes: list[Node]) -> None:
    await put_stable_group(nodes[0], member("m", 60_000, now_ms()))

    async def leased() -> bool:
        return any("g" in n.groups.held for n in nodes)

    await eventually(leased)
    await nodes[0].groups.store.update("g", lambda group, now: (ClassicGroup("g"), None))

    async def released() -> bool:
        return await read_lease(nodes[0].metadata, "g") is None

    await eventually(released)


async def test_waiter_wakes_when_the_group_changes(nodes: list[Node]) -> None:
    waiting = asyncio.create_task(
        nodes[1].groups.wait_for("g", lambda group: group if group else None, 10.0)
    )
    await asyncio.sleep(0.1)
    started = time.monotonic()
    await put_stable_group(nodes[0], member("m", 60_000, now_ms()))
    assert await waiting is not None
    assert time.monotonic() - started < 0.9  # woken by the notification, not the re-check
