"""This broker's part in running consumer groups: long polls, leases and timers.

Any broker serves any group request: state is shared and every change is a compare-and-set
(:mod:`.store`). What cannot be shared is *time*: something must notice that a member's
session ended or that a rebalance deadline passed when no request arrives. That is the job of
the broker holding the group's *lease*, an ephemeral key (``group-leases/<group>``) written
through this broker's metadata-store session, naming the broker (id, pid, address).

- A group with members needs a lease holder. The preferred one is the rendezvous-hash owner of
  the group among all live brokers; any other broker takes a lease that has been missing for
  :data:`LEASE_GRACE_S`, so a group never waits on a broker that is itself gone.
- When the holder dies its session expires, the metadata store deletes the lease, and another
  broker acquires it. Deadlines live in the group record and heartbeats in ``group-alive/``
  keys written by whichever broker served them, so the new holder knows everything the old one
  did: failover loses no timer.
- The holder re-evaluates a group whenever its record changes and when its next deadline is
  due; evaluation is the pure ``advance`` of the group's protocol, written by compare-and-set.
  Two holders (a lease lost while evaluating) would at worst make the same decision twice;
  compare-and-set keeps the record consistent.

Long polls (a JoinGroup waiting for the rebalance to complete, a SyncGroup waiting for the
leader) wait on change notifications of the group record, not on a sleep loop; a SyncGroup
keeps its member alive meanwhile, as a member awaiting its assignment sends no heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

import msgpack

from icefloe.config.groups import GroupOptions
from icefloe.errors import ConflictError, IcefloeError
from icefloe.groups import classic, consumer, keys
from icefloe.groups.model import ClassicGroup, ConsumerGroup, Group, TopicInfo
from icefloe.groups.store import GroupStore, now_ms
from icefloe.keyspace import prefix_end
from icefloe.ports.metadata import (
    MUST_NOT_EXIST,
    EventKind,
    Follower,
    MetadataStore,
    Session,
    WatchEvent,
)

if TYPE_CHECKING:
    from icefloe.cluster import Cluster
    from icefloe.topics.registry import TopicRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")

LEASE_GRACE_S: Final = 1.0
"""How long a non-preferred broker lets a needed lease stay vacant before it takes it."""
SWEEP_INTERVAL_S: Final = 0.5
"""How often vacant leases are looked for, besides on notifications."""
WAIT_RECHECK_S: Final = 1.0
"""Long polls re-read the record at least this often (notifications are the fast path)."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who runs a group's timers."""

    node_id: int
    pid: int
    host: str
    port: int

    def encode(self) -> bytes:
        return msgpack.packb([self.node_id, self.pid, self.host, self.port])  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, value: bytes) -> Lease:
        node_id, pid, host, port = msgpack.unpackb(value)
        return cls(node_id, pid, host, port)


async def read_lease(metadata: MetadataStore, group_id: str) -> Lease | None:
    """The current lease holder of a group, if any."""
    record = await metadata.get(keys.lease(group_id))
    return None if record is None else Lease.decode(record.value)


def needs_lease(group: Group) -> bool:
    """Whether some broker must run timers for the group: it has members or pending joins."""
    if isinstance(group, ClassicGroup):
        return bool(group.members or group.pending)
    return bool(group.members)


class GroupCoordinator:
    """Group state access for handlers, plus the timers of the groups this broker leases."""

    def __init__(
        self,
        metadata: MetadataStore,
        cluster: Cluster,
        topics: TopicRegistry,
        options: GroupOptions,
        session_ttl: float,
    ) -> None:
        self.store = GroupStore(metadata)
        self.options = options
        self._metadata = metadata
        self._cluster = cluster
        self._topics = topics
        self._ttl = session_ttl
        self._session: Session | None = None
        self._followers: list[Follower] = []
        self._timers: asyncio.Task[None] | None = None
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._wake = asyncio.Event()
        self._dirty: set[str] = set()
        self._active: set[str] = set()
        """Groups that need a lease holder."""
        self._leased: set[str] = set()
        """Groups whose lease someone holds (from notifications)."""
        self._held: dict[str, int] = {}
        """Leases this broker holds: group id → lease record version."""
        self._due: dict[str, float] = {}
        """Next evaluation of each held group, wall-clock ms."""
        self._vacant_since: dict[str, float] = {}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Follow group and lease changes and start the timer loop (after the cluster join)."""
        self._session = await self._metadata.open_session(self._ttl)
        groups_watch = await self._metadata.watch(keys.GROUPS)
        leases_watch = await self._metadata.watch(keys.LEASES)
        await self._rescan()
        self._followers = [
            Follower(groups_watch, self._group_changed, "groups-follow"),
            Follower(leases_watch, self._lease_changed, "group-leases-follow"),
        ]
        self._timers = asyncio.create_task(self._run(), name="group-timers")

    async def stop(self) -> None:
        """Stop the timers and give up every lease at once (closing the session)."""
        if self._timers is not None:
            self._timers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timers
        for follower in self._followers:
            await follower.stop()
        if self._session is not None:
            await self._session.close()
        self._held.clear()
        for events in self._waiters.values():
            for event in events:
                event.set()

    @property
    def held(self) -> frozenset[str]:
        """Groups whose lease this broker holds."""
        return frozenset(self._held)

    # --- for handlers ---------------------------------------------------------------------

    async def wait_for(
        self, group_id: str, check: Callable[[Group | None], T | None], timeout_s: float
    ) -> T | None:
        """Wait until ``check(group)`` is not ``None`` and return it; ``None`` on timeout."""
        event = asyncio.Event()
        waiters = self._waiters.setdefault(group_id, set())
        waiters.add(event)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            while True:
                event.clear()  # before reading: a change after this read wakes us
                stored = await self.store.load(group_id)
                result = check(stored.group if stored else None)
                if result is not None:
                    return result
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, WAIT_RECHECK_S)):
                        await event.wait()
        finally:
            waiters.discard(event)
            if not waiters:
                self._waiters.pop(group_id, None)

    @contextlib.asynccontextmanager
    async def kept_alive(
        self, group_id: str, member_id: str, session_timeout_ms: int
    ) -> AsyncIterator[None]:
        """Keep a member alive while this broker holds its request: a follower waiting in
        SyncGroup for the leader's assignment sends no heartbeats, and must not expire for the
        leader's delay. Kept alive only as long as this broker (and the request) is."""

        async def touch_until_cancelled() -> None:
            while True:
                try:
                    await self.store.touch(group_id, member_id)
                except IcefloeError as exc:  # the wait goes on; the member may lapse meanwhile
                    log.debug("group %r: keeping %s alive failed: %s", group_id, member_id, exc)
                await asyncio.sleep(max(session_timeout_ms / 3000, 0.1))

        task = asyncio.create_task(touch_until_cancelled(), name=f"group-keep-alive:{group_id}")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def catalog(self) -> dict[str, TopicInfo]:
        """Every topic this broker knows, as assignors see them."""
        return {t.name: TopicInfo(t.topic_id, t.partitions) for t in self._topics.cached()}

    async def catalog_with(self, names: Iterable[str]) -> dict[str, TopicInfo]:
        """:meth:`catalog`, with named topics it lacks looked up in the store.

        A topic created through another broker may not have reached this broker's cache yet;
        missing it would look like a deleted topic and take its partitions from the group.
        """
        catalog = self.catalog()
        for name in set(names) - catalog.keys():
            topic = await self._topics.get(name)
            if topic is not None:
                catalog[name] = TopicInfo(topic.topic_id, topic.partitions)
        return catalog

    # --- notifications --------------------------------------------------------------------

    async def _group_changed(self, event: WatchEvent) -> None:
        if event.kind is EventKind.RESET:
            for events in self._waiters.values():
                for waiter in events:
                    waiter.set()
            self._dirty.add("")  # "" asks the loop for a full rescan
        elif event.key is not None:
            group_id = keys.group_of(event.key, keys.GROUPS)
            if group_id is None:
                return
            for waiter in self._waiters.get(group_id, ()):
                waiter.set()
            self._dirty.add(group_id)
        self._wake.set()

    async def _lease_changed(self, event: WatchEvent) -> None:
        if event.kind is EventKind.RESET:
            self._dirty.add("")
        elif event.key is not None:
            group_id = keys.group_of(event.key, keys.LEASES)
            if group_id is None:
                return
            if event.kind is EventKind.PUT:
                self._leased.add(group_id)
            else:
                self._leased.discard(group_id)
                self._dirty.add(group_id)
        self._wake.set()

    # --- the timer loop -------------------------------------------------------------------

    async def _run(self) -> None:
        next_sweep = 0.0
        while True:
            now = now_ms()
            due = min(self._due.values(), default=math.inf)
            sleep_s = max(0.0, min((due - now) / 1000, SWEEP_INTERVAL_S))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(sleep_s):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._renew_session_if_lost()
                dirty, self._dirty = self._dirty, set()
                if "" in dirty:
                    await self._rescan()
                for group_id in dirty - {""}:
                    await self._refresh(group_id)
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + SWEEP_INTERVAL_S
                    for group_id in sorted(self._active - self._held.keys() - self._leased):
                        await self._try_acquire(group_id)
                now = now_ms()
                for group_id in [g for g, t in self._due.items() if t <= now]:
                    await self._evaluate(group_id)
            except IcefloeError:
                log.warning("group timers: metadata store error; will retry", exc_info=True)
                await asyncio.sleep(SWEEP_INTERVAL_S * random.uniform(0.5, 1.5))

    async def _renew_session_if_lost(self) -> None:
        if self._session is not None and self._session.alive:
            return
        if self._held:
            log.warning("group lease session lost; giving up %d group leases", len(self._held))
        self._held.clear()
        self._due.clear()
        self._session = await self._metadata.open_session(self._ttl)
        self._dirty.add("")

    async def _rescan(self) -> None:
        leases = await self._metadata.scan(keys.LEASES, prefix_end(keys.LEASES))
        self._leased = {g for r in leases if (g := keys.group_of(r.key, keys.LEASES)) is not None}
        self._active = {s.group.group_id for s in await self.store.list() if needs_lease(s.group)}
        for group_id in list(self._held):
            if group_id not in self._active:
                await self._release(group_id)
            else:
                self._due[group_id] = 0

    async def _refresh(self, group_id: str) -> None:
        """A group or its lease changed: update what this broker does about it."""
        stored = await self.store.load(group_id)
        if stored is None or not needs_lease(stored.group):
            self._active.discard(group_id)
            self._vacant_since.pop(group_id, None)
            if group_id in self._held:
                await self._release(group_id)
            return
        self._active.add(group_id)
        if group_id in self._held:
            self._due[group_id] = 0  # re-evaluate: the change may have moved a deadline
        elif group_id not in self._leased:
            await self._try_acquire(group_id)

    async def _try_acquire(self, group_id: str) -> None:
        me = self._cluster.me
        if me is None or self._session is None:
            return
        if self._cluster.coordinator(group_id, None).node_id != me.node_id:
            vacant = self._vacant_since.setdefault(group_id, time.monotonic())
            if time.monotonic() - vacant < LEASE_GRACE_S:
                return
        lease = Lease(me.node_id, os.getpid(), me.host, me.port)
        try:
            record = await self._metadata.put(
                keys.lease(group_id),
                lease.encode(),
                expected_version=MUST_NOT_EXIST,
                session=self._session,
            )
        except ConflictError:
            self._leased.add(group_id)
            self._vacant_since.pop(group_id, None)
            return
        log.info("broker %d now runs the timers of group %r", me.node_id, group_id)
        self._vacant_since.pop(group_id, None)
        self._leased.add(group_id)
        self._held[group_id] = record.version
        self._due[group_id] = 0

    async def _release(self, group_id: str) -> None:
        version = self._held.pop(group_id, None)
        self._due.pop(group_id, None)
        if version is not None:
            with contextlib.suppress(ConflictError):
                await self._metadata.delete(keys.lease(group_id), expected_version=version)

    async def _evaluate(self, group_id: str) -> None:
        """Apply the group's due timers; schedule the next evaluation."""
        self._due[group_id] = math.inf
        alive = await self.store.liveness(group_id)
        current = await self.store.load(group_id)
        subscribed = (
            [n for m in current.group.members for n in m.subscribed_topic_names]
            if current is not None and isinstance(current.group, ConsumerGroup)
            else []
        )
        catalog = await self.catalog_with(subscribed)
        options = self.options

        def advance(group: Group | None, now: int) -> tuple[Group | None, None]:
            if group is None:
                return None, None
            if isinstance(group, ClassicGroup):
                return classic.advance(group, alive, now, options), None
            return consumer.advance(group, alive, catalog, now, options), None

        before = current
        decision = await self.store.update(group_id, advance)
        stored = decision.stored
        if stored is None or not needs_lease(stored.group):
            self._active.discard(group_id)
            await self._release(group_id)
        else:
            self._due[group_id] = _next_deadline(stored.group, alive, options)
        if decision.changed and before is not None:
            remaining = {m.member_id for m in stored.group.members} if stored else set()
            removed = {m.member_id for m in before.group.members} - remaining
            await self.store.forget(group_id, removed & alive.keys())


def _next_deadline(group: Group, alive: Mapping[str, int], options: GroupOptions) -> float:
    if isinstance(group, ClassicGroup):
        deadline = classic.next_deadline(group, alive)
    else:
        deadline = consumer.next_deadline(group, alive, options)
    return math.inf if deadline is None else deadline
