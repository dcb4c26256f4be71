"""The transaction coordinator on the embedded store: two coordinators (two brokers) over the
same metadata, a broker that dies between deciding and writing the markers, fencing, timeouts,
and the last stable offset each partition reports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from kio.schema.errors import ErrorCode

from icefloe.groups.store import GroupStore
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record, build_batch
from icefloe.storage.transactions import OpenMark
from icefloe.topics.registry import TopicRegistry
from icefloe.transactions import coordinator as coordinators
from icefloe.transactions.coordinator import TransactionCoordinator, TransactionError
from icefloe.transactions.state import Status
from tests.support.waiting import eventually


@pytest.fixture
async def pair(
    storage: StreamStorage, other_storage: StreamStorage
) -> AsyncIterator[tuple[TransactionCoordinator, TransactionCoordinator]]:
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


async def write(storage: StreamStorage, registry_topic: str, pid: int, epoch: int) -> int:
    topic = await TopicRegistry(storage).get(registry_topic)
    assert topic is not None
    batch = build_batch(
        [Record(0, 1, None, b"v")],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=0,
        is_transactional=True,
    )
    return await storage.append_batches(topic.streams[0], batch)


async def stream_of(storage: StreamStorage, topic: str, partition: int = 0) -> int:
    found = await TopicRegistry(storage).get(topic)
    assert found is not None
    return found.streams[partition]


async def test_any_broker_serves_any_step_and_the_stable_offset_follows(
    pair: tuple[TransactionCoordinator, TransactionCoordinator], storage: StreamStorage
) -> None:
    one, two = pair
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    assert await two.add_partitions("tx", pid, epoch, [("orders", 0)]) == {
        ("orders", 0): ErrorCode.none
    }
    stream = await stream_of(storage, "orders")
    first = await write(storage, "orders", pid, epoch)
    marks = storage.transactions
    assert await marks.confirm_stable_offset(stream, first + 1, [pid]) == first
    await one.end("tx", pid, epoch, commit=False)
    assert await marks.confirm_stable_offset(stream, first + 2, [pid]) == first + 2
    aborted = await marks.aborted(stream, 0, first + 2)
    assert [(a.producer_id, a.first_offset, a.marker_offset) for a in aborted] == [
        (pid, first, first + 1)
    ]
    state = await two.describe("tx")
    assert state is not None
    assert state.status is Status.COMPLETE_ABORT


async def test_a_decided_transaction_left_by_a_dead_broker_is_finished_by_another(
    pair: tuple[TransactionCoordinator, TransactionCoordinator],
    storage: StreamStorage,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one, two = pair
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    await one.add_partitions("tx", pid, epoch, [("orders", 0), ("orders", 1)])
    first = await write(storage, "orders", pid, epoch)

    async def dies(*args: object) -> None:
        raise RuntimeError("the broker died before writing the markers")

    monkeypatch.setattr(one, "_finish", dies)
    with pytest.raises(RuntimeError):
        await one.end("tx", pid, epoch, commit=True)
    state = await two.describe("tx")
    assert state is not None
    assert state.status is Status.PREPARE_COMMIT  # decided, not finished: LSO still held
    stream = await stream_of(storage, "orders")
    assert storage.transactions.stable_offset(stream, first + 1) == first

    monkeypatch.setattr(coordinators, "STUCK_AFTER_MS", -1)
    assert await two.sweep() == 1
    state = await two.describe("tx")
    assert state is not None
    assert state.status is Status.COMPLETE_COMMIT
    # This broker hears of it through the store's watch.
    await eventually(lambda: storage.transactions.stable_offset(stream, first + 2) == first + 2)
    assert await storage.transactions.aborted(stream, 0, first + 2) == []


async def test_a_new_instance_aborts_what_the_old_left_and_fences_it(
    pair: tuple[TransactionCoordinator, TransactionCoordinator], storage: StreamStorage
) -> None:
    one, two = pair
    pid, old_epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    await one.add_partitions("tx", pid, old_epoch, [("orders", 0)])
    first = await write(storage, "orders", pid, old_epoch)
    same_pid, new_epoch = await two.init_producer_id("tx", 60_000, -1, -1)
    assert same_pid == pid
    assert new_epoch > old_epoch
    stream = await stream_of(storage, "orders")
    aborted = await storage.transactions.aborted(stream, 0, first + 10)
    assert [a.first_offset for a in aborted] == [first]
    with pytest.raises(TransactionError) as fenced:
        await one.add_partitions("tx", pid, old_epoch, [("orders", 1)])
    assert fenced.value.error_code is ErrorCode.producer_fenced


async def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
    pair: tuple[TransactionCoordinator, TransactionCoordinator], storage: StreamStorage
) -> None:
    one, two = pair
    pid, epoch = await one.init_producer_id("tx", 1, -1, -1)
    await one.add_partitions("tx", pid, epoch, [("orders", 0)])
    state = await one.describe("tx")
    assert state is not None
    assert state.timed_out(state.started_ms + 2)
    # Make it old enough without sleeping: rewrite its start time.
    stored = await one._load("tx")
    assert stored is not None
    await one._store(replace(stored[0], started_ms=0), stored[1])
    assert await two.sweep() == 1
    with pytest.raises(TransactionError) as fenced:
        await one.end("tx", pid, epoch, commit=True)
    assert fenced.value.error_code is ErrorCode.producer_fenced


async def test_bad_requests_get_kafkas_errors(
    pair: tuple[TransactionCoordinator, TransactionCoordinator],
) -> None:
    one, _ = pair
    with pytest.raises(TransactionError) as timeout:
        await one.init_producer_id("tx", 3_600_000, -1, -1)
    assert timeout.value.error_code is ErrorCode.invalid_transaction_timeout
    with pytest.raises(TransactionError) as unknown:
        await one.end("never-initialised", 7, 0, commit=True)
    assert unknown.value.error_code is ErrorCode.invalid_producer_id_mapping
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    assert await one.add_partitions("tx", pid, epoch, [("orders", 5), ("orders", 0)]) == {
        ("orders", 5): ErrorCode.unknown_topic_or_partition,
        ("orders", 0): ErrorCode.operation_not_attempted,
    }
    with pytest.raises(TransactionError) as no_group:
        await one.commit_offsets("tx", pid, epoch, "g", {("orders", 0): (1, -1, None)})
    assert no_group.value.error_code is ErrorCode.invalid_txn_state


async def test_a_transactional_id_idle_past_its_expiration_is_forgotten(
    pair: tuple[TransactionCoordinator, TransactionCoordinator],
) -> None:
    one, two = pair
    await one.init_producer_id("old", 60_000, -1, -1)
    await one.init_producer_id("recent", 60_000, -1, -1)
    stored = await one._load("old")  # a test of the sweep, not of the clock
    assert stored is not None
    await one._store(replace(stored[0], updated_ms=0), stored[1])
    assert await two.sweep() == 1
    assert await two.describe("old") is None
    assert await two.describe("recent") is not None


async def test_marks_written_after_the_transaction_ended_elsewhere_are_taken_back(
    pair: tuple[TransactionCoordinator, TransactionCoordinator],
    storage: StreamStorage,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one, two = pair
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    marks = storage.transactions
    write_mark = marks.mark_open

    async def ended_first(stream_id: int, mark: OpenMark) -> None:
        await two.end("tx", pid, epoch, commit=False)  # another broker, before the mark lands
        await write_mark(stream_id, mark)

    monkeypatch.setattr(marks, "mark_open", ended_first)
    with pytest.raises(TransactionError):
        await one.add_partitions("tx", pid, epoch, [("orders", 0)])
    assert await marks.stored_open_marks(await stream_of(storage, "orders")) == []


async def test_offsets_beyond_what_one_state_can_hold_are_refused_and_the_state_kept(
    pair: tuple[TransactionCoordinator, TransactionCoordinator],
) -> None:
    one, _ = pair
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    await one.add_offsets("tx", pid, epoch, "g")
    huge = {(f"topic-{i}", 0): (i, -1, "m" * 4096) for i in range(300)}
    with pytest.raises(TransactionError) as refused:
        await one.commit_offsets("tx", pid, epoch, "g", huge)
    assert refused.value.error_code is ErrorCode.invalid_request
    state = await one.describe("tx")
    assert state is not None
    assert state.offsets == {}


async def test_an_abort_of_a_transaction_that_committed_is_refused(
    pair: tuple[TransactionCoordinator, TransactionCoordinator],
) -> None:
    """A client whose commit timed out (the broker that decided it died) and that aborts then
    must not hear that its committed transaction was aborted: it would write it again."""
    one, two = pair
    pid, epoch = await one.init_producer_id("tx", 60_000, -1, -1)
    await one.add_partitions("tx", pid, epoch, [("orders", 0)])
    await one.end("tx", pid, epoch, commit=True)
    with pytest.raises(TransactionError) as refused:
        await two.end("tx", pid, epoch, commit=False)
    assert refused.value.error_code is ErrorCode.invalid_txn_state
    await two.end("tx", pid, epoch, commit=True)  # a retried commit is answered as done
