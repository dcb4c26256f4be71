"""Offsets committed in a transaction by a consumer group member (KIP-447), on the embedded
store with two coordinators (two brokers): the group fences a member that a rebalance left
behind, and the offsets stay pending, for every broker, until the transaction ends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from kio.schema.errors import ErrorCode

from icefloe.errors import KafkaError
from icefloe.groups.model import (
    ClassicGroup,
    ClassicMember,
    ClassicState,
    ConsumerGroup,
    ConsumerMember,
    Group,
)
from icefloe.groups.store import GroupStore
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from icefloe.transactions import coordinator as coordinators
from icefloe.transactions.coordinator import TransactionCoordinator, TransactionError
from icefloe.transactions.pending import PendingOffsets
from icefloe.transactions.state import GroupMember

Pair = tuple[TransactionCoordinator, TransactionCoordinator]
OFFSET = {("orders", 0): (5, -1, None)}


@pytest.fixture
async def pair(storage: StreamStorage, other_storage: StreamStorage) -> AsyncIterator[Pair]:
    registries = [TopicRegistry(storage), TopicRegistry(other_storage)]
    for registry in registries:
        await registry.start()
    await registries[0].create("orders", 2)
    yield tuple(  # type: ignore[misc]
        TransactionCoordinator(s.metadata, s, r, GroupStore(s.metadata))
        for s, r in zip((storage, other_storage), registries, strict=True)
    )
    for registry in registries:
        await registry.close()


def classic_member(member_id: str, instance_id: str | None = None) -> ClassicMember:
    return ClassicMember(
        member_id, instance_id, "app", "/127.0.0.1", 10_000, 30_000, "consumer", ()
    )


async def put_group(storage: StreamStorage, group: Group) -> None:
    await GroupStore(storage.metadata).update(group.group_id, lambda _, now: (group, None))


async def in_transaction(one: TransactionCoordinator, group_id: str = "g") -> tuple[int, int]:
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    await one.add_offsets("tx", pid, epoch, group_id)
    return pid, epoch


async def refusal(one: TransactionCoordinator, pid: int, epoch: int, member: GroupMember) -> object:
    with pytest.raises(TransactionError) as refused:
        await one.commit_offsets("tx", pid, epoch, "g", OFFSET, member)
    return refused.value.error_code


async def test_a_classic_group_fences_members_a_rebalance_left_behind(
    pair: Pair, storage: StreamStorage
) -> None:
    one, _ = pair
    group = ClassicGroup(
        "g",
        state=ClassicState.STABLE,
        generation=4,
        protocol_type="consumer",
        protocol_name="range",
        leader="a",
        members=(classic_member("a"), classic_member("s2", "static")),
    )
    await put_group(storage, group)
    pid, epoch = await in_transaction(one)
    assert await refusal(one, pid, epoch, GroupMember("a", None, 3)) is ErrorCode.illegal_generation
    assert await refusal(one, pid, epoch, GroupMember("gone", None, 4)) is (
        ErrorCode.unknown_member_id
    )
    assert await refusal(one, pid, epoch, GroupMember("s1", "static", 4)) is (
        ErrorCode.fenced_instance_id
    )
    state = await one.describe("tx")
    assert state is not None
    assert state.offsets == {}  # nothing refused was kept
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET, GroupMember("a", None, 4))
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET, GroupMember("s2", "static", 4))
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET)  # v0-2: no member named


async def test_a_consumer_group_fences_members_by_their_epoch(
    pair: Pair, storage: StreamStorage
) -> None:
    one, _ = pair
    member = ConsumerMember("a", member_epoch=7, previous_member_epoch=6)
    await put_group(
        storage, ConsumerGroup("g", group_epoch=7, assignment_epoch=7, members=(member,))
    )
    pid, epoch = await in_transaction(one)
    for stale in (6, 8):
        assert await refusal(one, pid, epoch, GroupMember("a", None, stale)) is (
            ErrorCode.illegal_generation
        )
    assert await refusal(one, pid, epoch, GroupMember("b", None, 7)) is ErrorCode.unknown_member_id
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET, GroupMember("a", None, 7))


async def test_a_group_that_does_not_exist_takes_only_commits_without_a_generation(
    pair: Pair, storage: StreamStorage
) -> None:
    one, two = pair
    pid, epoch = await in_transaction(one)
    assert await refusal(one, pid, epoch, GroupMember("a", None, 1)) is ErrorCode.illegal_generation
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET, GroupMember())
    await two.end("tx", pid, epoch, commit=True)
    # Offsets make a group, as Kafka's "simple" groups: empty, classic, listed.
    stored = await GroupStore(storage.metadata).load("g")
    assert stored is not None
    assert stored.group == ClassicGroup("g")
    assert (await GroupStore(storage.metadata).fetch_offsets("g"))[("orders", 0)].offset == 5


async def test_a_rebalance_between_the_check_and_the_mark_refuses_the_commit(
    pair: Pair, storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member is checked again once the partitions are marked pending: a new owner that
    read the offsets before the mark was written must not see them change later."""
    one, two = pair
    group = ClassicGroup(
        "g", ClassicState.STABLE, 4, "consumer", "range", "a", (classic_member("a"),)
    )
    await put_group(storage, group)
    pid, epoch = await in_transaction(one)
    marks = PendingOffsets.mark

    async def rebalanced_meanwhile(self: PendingOffsets, *args: object) -> None:
        await put_group(storage, ClassicGroup("g", ClassicState.STABLE, 5, members=group.members))
        await marks(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(PendingOffsets, "mark", rebalanced_meanwhile)
    assert await refusal(one, pid, epoch, GroupMember("a", None, 4)) is ErrorCode.illegal_generation
    state = await two.describe("tx")
    assert state is not None
    assert state.offsets == {}


async def test_offsets_are_pending_on_every_broker_until_the_transaction_ends(
    pair: Pair, storage: StreamStorage
) -> None:
    one, two = pair
    groups = GroupStore(storage.metadata)
    for commit, offset in ((True, 5), (False, 9)):
        pid, epoch = await in_transaction(one)
        await one.commit_offsets("tx", pid, epoch, "g", {("orders", 0): (offset, -1, None)})
        assert await one.pending_offsets("g") == {("orders", 0)}
        assert await two.pending_offsets("g") == {("orders", 0)}
        assert await two.pending_offsets("other-group") == set()
        await two.end("tx", pid, epoch, commit=commit)
        assert await one.pending_offsets("g") == set()
        assert (await groups.fetch_offsets("g"))[("orders", 0)].offset == 5  # the abort left 5
        assert [m async for m in PendingOffsets(storage.metadata).every_mark()] == []


async def test_offsets_of_a_transaction_ended_by_a_new_instance_or_its_timeout_stop_pending(
    pair: Pair, storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = pair
    pid, epoch = await in_transaction(one)
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET)
    await two.init_producer_id("tx", 60_000, -1, -1)  # the next instance aborts it
    assert await one.pending_offsets("g") == set()
    assert (await GroupStore(storage.metadata).fetch_offsets("g")) == {}

    # A broker that died after marking, before its transaction ended, leaves a mark no one
    # deletes: it stops counting once the transaction ends, and the sweep takes it away.
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    await one.add_offsets("tx", pid, epoch, "g")
    await one.commit_offsets("tx", pid, epoch, "g", OFFSET)

    async def died(*args: object) -> None:
        raise RuntimeError("the broker died before deleting its marks")

    monkeypatch.setattr(PendingOffsets, "clear_transaction", died)
    with pytest.raises(RuntimeError):
        await one.end("tx", pid, epoch, commit=False)
    monkeypatch.undo()
    monkeypatch.setattr(coordinators, "STUCK_AFTER_MS", -1)
    assert await two.sweep() == 1  # finishes the abort, and with it the mark
    assert await two.pending_offsets("g") == set()
    assert [m async for m in PendingOffsets(storage.metadata).every_mark()] == []


async def test_a_mark_left_behind_counts_for_nothing_and_is_swept(
    pair: Pair, storage: StreamStorage
) -> None:
    one, two = pair
    pid, epoch = await in_transaction(one)
    state = await one.describe("tx")
    assert state is not None
    await one.end("tx", pid, epoch, commit=False)
    # A TxnOffsetCommit that checked the transaction before it ended marks after the end.
    await PendingOffsets(storage.metadata).mark("g", state, [("orders", 1)])
    assert await two.pending_offsets("g") == set()
    assert await two.sweep() == 1
    assert [m async for m in PendingOffsets(storage.metadata).every_mark()] == []


async def test_ids_too_long_to_mark_together_are_refused_with_kafkas_invalid_request(
    pair: Pair,
) -> None:
    one, _ = pair
    group, transactional_id = "g" * 600, "t" * 500  # each fits a store key, not both together
    pid, epoch = await one.init_producer_id(transactional_id, 60_000, -1, -1)
    await one.add_offsets(transactional_id, pid, epoch, group)
    with pytest.raises(KafkaError) as refused:
        await one.commit_offsets(transactional_id, pid, epoch, group, OFFSET)
    assert refused.value.error_code is ErrorCode.invalid_request
    assert await one.pending_offsets(group) == set()
    assert await one.pending_offsets("g" * 2000) == set()
    await one.end(transactional_id, pid, epoch, commit=True)  # and it still ends
