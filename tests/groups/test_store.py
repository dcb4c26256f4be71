"""Group records and offsets in the embedded SQLite metadata store (real, not mocked)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest

from icefloe.config import Config
from icefloe.errors import ConflictError
from icefloe.groups.model import ClassicGroup, Group
from icefloe.groups.store import CommittedOffset, GroupStore
from icefloe.storage.engine import StreamStorage


def bumper(group_id: str) -> Callable[[Group | None, int], tuple[Group, int]]:
    """A decision that creates the group or bumps its generation."""

    def bump(group: Group | None, now: int) -> tuple[Group, int]:
        current = group if isinstance(group, ClassicGroup) else ClassicGroup(group_id)
        new = replace(current, generation=current.generation + 1)
        return new, new.generation

    return bump


bump = bumper("g")


async def test_concurrent_updates_from_two_processes_all_apply(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stores = [GroupStore(storage.metadata), GroupStore(other_storage.metadata)]
    await asyncio.gather(*(stores[i % 2].update("g", bump) for i in range(20)))
    stored = await stores[0].load("g")
    assert stored is not None
    assert isinstance(stored.group, ClassicGroup)
    assert stored.group.generation == 20


async def test_decision_without_a_change_writes_nothing(storage: StreamStorage) -> None:
    store = GroupStore(storage.metadata)
    decision = await store.update("g", lambda group, now: (None, "untouched"))
    assert (decision.result, decision.stored, decision.changed) == ("untouched", None, False)
    assert await store.load("g") is None


async def test_offsets_survive_reopening_the_store(config: Config) -> None:
    offset = CommittedOffset(42, 3, "meta", 1_000)
    async with await StreamStorage.open(config) as storage:
        await GroupStore(storage.metadata).commit_offsets("g", {("t", 5): offset}, None)
    async with await StreamStorage.open(config) as storage:
        assert await GroupStore(storage.metadata).fetch_offsets("g") == {("t", 5): offset}


async def test_commit_guarded_by_an_old_group_version_is_refused(storage: StreamStorage) -> None:
    store = GroupStore(storage.metadata)
    first = await store.update("g", bump)
    await store.update("g", bump)
    assert first.stored is not None
    with pytest.raises(ConflictError):
        await store.commit_offsets("g", {("t", 0): CommittedOffset(1, -1, None, 0)}, first.stored)
    assert await store.fetch_offsets("g") == {}


async def test_fetch_returns_only_the_requested_partitions(storage: StreamStorage) -> None:
    store = GroupStore(storage.metadata)
    offsets = {("t", p): CommittedOffset(p, -1, None, 0) for p in range(3)}
    await store.commit_offsets("g", {**offsets, ("u", 0): CommittedOffset(9, -1, None, 0)}, None)
    assert await store.fetch_offsets("g", {"t": [0, 2]}) == {
        ("t", 0): offsets[("t", 0)],
        ("t", 2): offsets[("t", 2)],
    }


async def test_group_ids_with_slashes_do_not_collide(storage: StreamStorage) -> None:
    store = GroupStore(storage.metadata)
    await store.update("a/b", bumper("a/b"))
    await store.update("a", bumper("a"))
    await store.commit_offsets("a/b", {("t", 0): CommittedOffset(1, -1, None, 0)}, None)
    assert sorted(s.group.group_id for s in await store.list()) == ["a", "a/b"]
    assert await store.fetch_offsets("a") == {}


async def test_deleting_a_group_removes_its_offsets(storage: StreamStorage) -> None:
    store = GroupStore(storage.metadata)
    decision = await store.update("g", bump)
    await store.commit_offsets("g", {("t", 0): CommittedOffset(1, -1, None, 0)}, None)
    assert decision.stored is not None
    assert await store.delete("g", decision.stored)
    assert await store.load("g") is None
    assert await store.fetch_offsets("g") == {}
