"""Idempotent producers' leases: sequences checked in memory, handed over, taken over."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

from icefloe import metrics
from icefloe.ports.metadata import Record
from icefloe.storage import keys
from icefloe.storage.engine import StreamStorage
from icefloe.storage.producers import (
    IDLE_RELEASE_S,
    Claim,
    ClaimPending,
    Duplicate,
    ProducerError,
    ProducerRecord,
    SequenceRange,
)
from icefloe.storage.records import Record as KafkaRecord
from icefloe.storage.records import build_batch
from tests.support.storage import storage_config
from tests.support.storage_processes import append_idempotent_then_die, idempotent_batch

SPAWN = multiprocessing.get_context("spawn")


async def stored_state(storage: StreamStorage, stream: int, producer_id: int) -> ProducerRecord:
    record = await storage.metadata.get(keys.producer_state(stream, producer_id))
    assert record is not None
    return ProducerRecord.decode(record.value, record.version)


async def released(storage: StreamStorage, stream: int, producer_id: int) -> ProducerRecord:
    """The stored state once this engine has released the idle producer's lease."""
    give_up = time.monotonic() + IDLE_RELEASE_S + 10
    while (state := await stored_state(storage, stream, producer_id)).owner:
        assert time.monotonic() < give_up, "the idle lease was never released"
        await asyncio.sleep(0.05)
    return state


def metadata_ops() -> dict[str, float]:
    """Metadata-store operations made in this process so far, by operation."""
    [family] = metrics.METADATA_SECONDS.collect()
    return {s.labels["op"]: s.value for s in family.samples if s.name.endswith("_count")}


def made_since(before: dict[str, float]) -> dict[str, float]:
    return {op: n - before.get(op, 0) for op, n in metadata_ops().items() if n != before.get(op)}


async def values(storage: StreamStorage, stream: int) -> list[bytes]:
    return [r.value for r in await storage.read_records(stream, 0)]


async def append_as_a_client_would(
    storage: StreamStorage, stream: int, batch: bytes, within: float = 30
) -> int:
    """Append, retrying while another process holds the producer's lease."""
    give_up = time.monotonic() + within
    while True:
        try:
            return await storage.append_batches(stream, batch)
        except ClaimPending:
            if time.monotonic() > give_up:
                raise
            await asyncio.sleep(0.1)


async def test_an_active_producer_does_not_write_its_state_per_batch(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    pid = await storage.allocate_producer_id()
    await storage.append_batches(stream, idempotent_batch(pid, 0, 0))
    taken = await stored_state(storage, stream, pid)
    offsets = [
        await storage.append_batches(stream, idempotent_batch(pid, 0, 3 * n)) for n in range(1, 20)
    ]
    assert offsets == [3 * n for n in range(1, 20)]
    assert (await stored_state(storage, stream, pid)).version == taken.version
    assert taken.owner


async def test_the_lease_holder_answers_a_duplicate_and_refuses_a_gap(
    storage: StreamStorage,
) -> None:
    stream = await storage.create_stream("s")
    pid = await storage.allocate_producer_id()
    for n in range(3):
        await storage.append_batches(stream, idempotent_batch(pid, 0, 3 * n))
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 3)) == 3
    with pytest.raises(ProducerError, match="out of order"):
        await storage.append_batches(stream, idempotent_batch(pid, 0, 30))
    assert len(await values(storage, stream)) == 9


async def test_an_idle_producer_is_released_and_follows_its_client_to_another_engine(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    pid = await storage.allocate_producer_id()
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 0
    # The client moves: the first engine releases the idle lease and the other takes it.
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 3)) == 3
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 6)) == 6
    # ... and back again.
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 9)) == 9
    assert await values(other_storage, stream) == [f"seq{i}".encode() for i in range(12)]


async def test_a_crashed_owners_batches_are_found_by_the_engine_that_takes_over(
    tmp_path: Path,
) -> None:
    settings = {"producer_lease_s": 2.0}
    async with await StreamStorage.open(storage_config(tmp_path, **settings)) as storage:
        stream = await storage.create_stream("s")
        pid = await storage.allocate_producer_id()
        # The child takes the lease with its first batch and dies before renewing it, so the
        # stored state names none of its four batches: they are only in the index.
        child = SPAWN.Process(
            target=append_idempotent_then_die,
            args=(str(tmp_path), stream, pid, 4),
            kwargs=settings,
        )
        child.start()
        await asyncio.to_thread(child.join, 60)
        assert child.exitcode == -9
        assert (await stored_state(storage, stream, pid)).batches == []

        # A retried batch is answered at once from the index, lease or not.
        assert await storage.append_batches(stream, idempotent_batch(pid, 0, 6)) == 6
        # A new one waits until the dead owner's lease has lapsed, then follows its batches.
        started = time.monotonic()
        assert await append_as_a_client_would(storage, stream, idempotent_batch(pid, 0, 12)) == 12
        assert time.monotonic() - started < 2 * settings["producer_lease_s"] + 1
        assert await values(storage, stream) == [f"seq{i}".encode() for i in range(15)]


async def test_a_commit_during_a_renewal_is_kept(tmp_path: Path) -> None:
    """The renewal's write is on its way when a batch commits: the batch keeps its offset."""
    async with await StreamStorage.open(storage_config(tmp_path, producer_lease_s=0.4)) as storage:
        producers, metadata = storage.producers, storage.metadata
        first = await producers.claim(1, 7, 0, 0, 2)
        assert isinstance(first, Claim)
        producers.committed(first, 0)
        second = await producers.claim(1, 7, 0, 3, 5)
        assert isinstance(second, Claim)

        real_put = metadata.put
        renewing, go_on = asyncio.Event(), asyncio.Event()

        async def held_put(*args: Any, **kwargs: Any) -> Record:
            renewing.set()
            await go_on.wait()
            return await real_put(*args, **kwargs)

        metadata.put = held_put  # type: ignore[method-assign]
        await asyncio.wait_for(renewing.wait(), 5)
        producers.committed(second, 3)
        metadata.put = real_put  # type: ignore[method-assign]
        go_on.set()
        await asyncio.sleep(0.05)

        assert await producers.claim(1, 7, 0, 3, 5) == Duplicate(3)


async def test_a_producer_back_after_a_pause_takes_its_released_lease_back_with_one_write(
    storage: StreamStorage,
) -> None:
    producers = storage.producers
    first = await producers.claim(1, 7, 0, 0, 2)
    assert isinstance(first, Claim)
    producers.committed(first, 0)
    await released(storage, 1, 7)

    before = metadata_ops()
    second = await producers.claim(1, 7, 0, 3, 5)

    assert isinstance(second, Claim)
    assert made_since(before) == {"put": 1}  # no reads: the state released is still the truth
    state = await stored_state(storage, 1, 7)
    assert state.owner
    assert state.batches == [SequenceRange(0, 2, 3, 0)]  # the new batch is accepted after it


async def test_a_released_lease_taken_by_another_engine_meanwhile_is_claimed_afresh(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await storage.create_stream("s")
    pid = await storage.allocate_producer_id()
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 0
    # The client moves to the other engine, which takes the released lease and writes 3-5 ...
    assert await append_as_a_client_would(other_storage, stream, idempotent_batch(pid, 0, 3)) == 3
    # ... then retries that batch here. What this engine released expects 3 next: only the
    # store tells that 3-5 is already written.
    assert await append_as_a_client_would(storage, stream, idempotent_batch(pid, 0, 3)) == 3

    assert await values(storage, stream) == [f"seq{i}".encode() for i in range(6)]


async def a_stream_with_a_record(storage: StreamStorage) -> int:
    """A stream whose log end the engine has seen (it wrote the stream's one record)."""
    stream = await storage.create_stream("s")
    assert await storage.append_batches(stream, build_batch([KafkaRecord(0, 0, None, b"r")])) == 0
    return stream


async def test_the_first_claim_of_a_producer_id_handed_out_here_only_writes_its_record(
    storage: StreamStorage,
) -> None:
    stream = await a_stream_with_a_record(storage)
    pid = await storage.allocate_producer_id()

    before = metadata_ops()
    claim = await storage.producers.claim(stream, pid, 0, 0, 2)

    assert isinstance(claim, Claim)
    assert made_since(before) == {"put": 1}  # created: no record, so nothing to read
    assert (await stored_state(storage, stream, pid)).owner


async def test_a_producer_id_handed_out_here_that_wrote_through_another_engine_is_read_back(
    storage: StreamStorage, other_storage: StreamStorage
) -> None:
    stream = await a_stream_with_a_record(storage)
    pid = await storage.allocate_producer_id()
    # The client got its id here but sent its first batch to the other engine ...
    assert await other_storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 1
    # ... and then moves here. Only the store knows of the batch at 1.
    assert await append_as_a_client_would(storage, stream, idempotent_batch(pid, 0, 3)) == 4
    assert await storage.append_batches(stream, idempotent_batch(pid, 0, 0)) == 1

    assert await values(storage, stream) == [b"r"] + [f"seq{i}".encode() for i in range(6)]
