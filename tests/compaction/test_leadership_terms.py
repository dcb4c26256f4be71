"""The compaction leader's fence: a new leader takes over every unfinished run by
compare-and-set, so that a step of the leader before it, still under way, fails and changes
nothing; and a leader that cannot prove its lease for a while stops acting, then goes on in
the same term once its session is renewed.

The two leaders here are two compactors on one embedded store, each with a lease whose clock
always holds (``Lease(None, term)``): what is tested is the fence of the records' versions,
which holds whatever the clocks did."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from icefloe.cli.tables import _leading
from icefloe.compaction.committer import SagaState
from icefloe.compaction.leadership import UNLEADED, LeadershipLostError, Lease
from icefloe.compaction.planner import Plan, plan_task
from icefloe.compaction.service import LEADER_KEY, Compactor
from icefloe.config import Config
from icefloe.ports.metadata import Session
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.topics.registry import TopicRegistry
from tests.compaction.conftest import table_config
from tests.compaction.test_saga_crashes import records, table_rows

OLD, NEW = 7, 11
"""The terms of the leader that planned the run and of the one that takes it over."""


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return table_config(tmp_path)


@pytest.fixture
async def storage(config: Config) -> AsyncIterator[StreamStorage]:
    async with await StreamStorage.open(config) as opened:
        yield opened


async def _compactor(config: Config, storage: StreamStorage, term: int) -> Compactor:
    topics = TopicRegistry(storage)
    await topics.start()
    compactor = await Compactor.open(config, storage, topics)
    compactor.committer.lease = Lease(None, term)
    return compactor


async def _close(compactor: Compactor) -> None:
    await compactor.close()
    await compactor.topics.close()


class _Held:
    """Holds the calls of ``method`` of ``target`` until :meth:`release`: a leader stopped
    at a step of the saga, as by a stall."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, target: Any, method: str) -> None:
        self.reached = asyncio.Event()
        self._go = asyncio.Event()
        original = getattr(target, method)

        async def held(*args: Any, **kwargs: Any) -> Any:
            self.reached.set()
            await self._go.wait()
            return await original(*args, **kwargs)

        monkeypatch.setattr(target, method, held)

    def release(self) -> None:
        self._go.set()


@pytest.mark.parametrize("held_at", ["engine", "table commit"])
async def test_a_step_of_the_old_leader_fails_on_a_run_the_new_one_took_over(
    config: Config, storage: StreamStorage, monkeypatch: pytest.MonkeyPatch, held_at: str
) -> None:
    old = await _compactor(config, storage, OLD)
    new = await _compactor(config, storage, NEW)
    try:
        topic = await old.topics.create("events", 1)
        (stream,) = topic.streams
        await storage.append(stream, records(5, "a"))
        if held_at == "engine":
            held = _Held(monkeypatch, old.engine, "run")
        else:
            held = _Held(monkeypatch, old.table_formats["iceberg"], "commit")
        old_round = asyncio.create_task(old.compact_once(force=True))
        await asyncio.wait_for(held.reached.wait(), 60)
        (found,) = await new.committer.unfinished()
        assert found.term == OLD
        assert found.state is (SagaState.PLANNED if held_at == "engine" else SagaState.WRITTEN)

        listed = found.version
        claimed = await new.committer.claim(found)

        assert claimed.term == NEW
        assert claimed.version != listed
        held.release()
        await old_round  # its next step fails on the record's version
        (stored,) = await new.committer.unfinished()
        assert (stored.version, stored.term, stored.state) == (
            claimed.version,
            NEW,
            claimed.state,
        ), "the old leader's late step changed the record"
        assert all(e.in_wal for e in await storage.index.scan(stream)), "the old leader swapped"

        await new.committer.finish(claimed)

        assert await new.committer.unfinished() == []
        entries = await storage.index.scan(stream)
        assert all(isinstance(e.location, ParquetLocation) for e in entries)
        rows = await table_rows(new, "events")
        assert rows["iceberg"] == rows["delta"] == [(0, i, f"a/{i}".encode()) for i in range(5)]
    finally:
        await _close(old)
        await _close(new)


async def test_every_unfinished_run_of_an_old_term_is_taken_over_and_finished(
    config: Config, storage: StreamStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader stopped with one run written and one planned: the next leader takes both
    over (the planned one is run again, not dropped) and each record reaches the tables once."""
    old = await _compactor(config, storage, OLD)
    new = await _compactor(config, storage, NEW)
    try:
        first = await old.topics.create("first", 1)
        second = await old.topics.create("second", 1)
        await storage.append(first.streams[0], records(3, "f"))
        held = _Held(monkeypatch, old.table_formats["iceberg"], "commit")
        first_round = asyncio.create_task(old.compact_once(force=True))
        await asyncio.wait_for(held.reached.wait(), 60)
        await storage.append(second.streams[0], records(2, "s"))
        # A second run, of the other stream, not run yet.
        planned = await old.committer.start(await _plan(old, config, busy=first.streams))
        first_round.cancel()  # the old leader stops there

        found = await new.committer.unfinished()
        assert [(r.state, r.term) for r in found] == [
            (SagaState.WRITTEN, OLD),
            (SagaState.PLANNED, OLD),
        ]
        await new.compact_once()

        assert await new.committer.unfinished() == []
        (entry,) = await storage.index.scan(second.streams[0])
        assert isinstance(entry.location, ParquetLocation)
        paths = {path for task in planned.tasks for _, path in task.output_paths}
        assert entry.location.key in paths, "the planned run was not the one finished"
        for name, tag, count in (("first", "f", 3), ("second", "s", 2)):
            rows = await table_rows(new, name)
            expected = [(0, i, f"{tag}/{i}".encode()) for i in range(count)]
            assert rows["iceberg"] == rows["delta"] == expected
    finally:
        await _close(old)
        await _close(new)


async def _plan(compactor: Compactor, config: Config, busy: list[int]) -> Plan:
    """The plan of the run the compactor would start next, leaving out ``busy`` streams."""
    plan = await plan_task(
        compactor.storage.index,
        compactor.topics.cached(),
        config.compactor,
        int(time.time() * 1000),
        force=True,
        busy=frozenset(busy),
    )
    assert plan is not None
    return plan


class _Session(Session):
    """A session renewed every tenth of a second unless ``answered`` is clear: a store that
    answers no keep-alive for a while (a unit test of the leader's own logic)."""

    def __init__(self, ttl: float) -> None:
        self.id = "test"
        self.ttl = ttl
        self.renewed_at = time.monotonic()
        self.answered = asyncio.Event()
        self.answered.set()
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._keep_alive = asyncio.create_task(self._renew())

    async def _renew(self) -> None:
        while True:
            await self.answered.wait()
            self.renewed_at = time.monotonic()
            await asyncio.sleep(0.1)

    @property
    def lost(self) -> asyncio.Future[None]:
        return self._lost

    async def close(self) -> None:
        self._keep_alive.cancel()
        if not self._lost.done():
            self._lost.set_result(None)


async def test_a_leader_that_cannot_prove_its_lease_waits_and_goes_on_in_its_term_once_renewed(
    tmp_path: Path,
) -> None:
    config = table_config(tmp_path, compactor={"interval_s": 0.05, "max_age_s": 0, "min_age_s": 0})
    async with await StreamStorage.open(config) as opened:
        compactor = await _compactor(config, opened, 0)
        session = _Session(ttl=1.5)
        try:
            topic = await compactor.topics.create("events", 1)
            (stream,) = topic.streams
            lease = Lease(session, NEW)
            compactor.committer.lease = lease
            stop = asyncio.Event()
            leading = asyncio.create_task(compactor._lead_while_held(stop, lease))
            await opened.append(stream, records(2, "a"))
            await _until(lambda: _compacted(opened, stream), "compacted while the lease holds")

            session.answered.clear()  # no keep-alive answered from now on
            await asyncio.sleep(session.ttl)  # past the leader's deadline
            await opened.append(stream, records(2, "b", first=2))
            await asyncio.sleep(1.0)
            assert not await _compacted(opened, stream), "compacted without proving the lease"
            assert not leading.done(), "the leader gave up a session that was not lost"

            session.answered.set()  # answered again before the session was lost
            await _until(lambda: _compacted(opened, stream), "compacted once renewed")
            rows = await table_rows(compactor, "events")
            assert len(rows["iceberg"]) == len(rows["delta"]) == 4

            await session.close()  # lost: the leadership ends
            await asyncio.wait_for(leading, 10)
        finally:
            await session.close()
            await _close(compactor)


async def _compacted(storage: StreamStorage, stream: int) -> bool:
    return not any(e.in_wal for e in await storage.index.scan(stream))


async def _until(condition: Any, what: str, within_s: float = 30) -> None:
    deadline = time.monotonic() + within_s
    while not await condition():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        await asyncio.sleep(0.05)


async def test_a_command_run_by_hand_is_fenced_by_its_lease(
    config: Config, storage: StreamStorage
) -> None:
    """`icefloe compact` and `icefloe maintain` hold the leader key: once their session is
    lost (the store stopped answering), they stop before a broker can lead."""
    compactor = await _compactor(config, storage, 0)
    try:
        topic = await compactor.topics.create("events", 1)
        await storage.append(topic.streams[0], records(2, "a"))
        async with _leading(compactor):
            lease = compactor.committer.lease
            leader = await storage.metadata.get(LEADER_KEY)
            assert leader is not None
            assert lease.session is not None
            assert lease.term == leader.version
            await lease.session.close()  # lost, as when the store stops answering
            with pytest.raises(LeadershipLostError):
                await compactor.compact_once(force=True)
        assert compactor.committer.lease is UNLEADED
        assert all(e.in_wal for e in await storage.index.scan(topic.streams[0]))
    finally:
        await _close(compactor)
