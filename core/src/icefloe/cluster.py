"""Broker membership and zone-aware routing.

Each broker registers an ephemeral record (id, host, port, zone) under ``brokers/`` through a
metadata-store session, so a dead broker disappears by itself. Routing is advisory: the broker a
client is told owns a partition is chosen among the live brokers of the client's zone (all
brokers when its zone has none), which keeps a partition's traffic on one broker per zone for
cache locality. Any broker still serves any partition.

A topic's partitions are spread evenly over those brokers (:func:`balanced_owners`): by
rendezvous hashing alone, a topic of 8 partitions on 2 brokers went 6 to 2 or worse about as
often as 4 to 4, and the busier broker set the pace of every client writing the topic. Group
and transaction coordinators, one per key among many keys, stay with plain rendezvous hashing.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import msgpack

from icefloe.errors import AlreadyExistsError, ConflictError, IcefloeError
from icefloe.keyspace import BROKERS, CLUSTER, prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, Follower, MetadataStore, Session, WatchEvent
from icefloe.storage import counters

log = logging.getLogger(__name__)

CLUSTER_ID_KEY: Final = CLUSTER + "id"
NODE_IDS: Final = CLUSTER + "node-ids/"
"""The node id of each address a broker without a configured ``node_id`` registered at."""
ZONE_TOKENS: Final = ("zone_id", "ws_az", "warpstream_az", "zone", "automq_az")
"""``client.id`` keys that name the client's zone (Ursa's, WarpStream's and AutoMQ's)."""
OWNERS_CACHED: Final = 1 << 18
"""Partition owners a broker keeps computed, across topics (a topic's are computed at once)."""
REGISTER_ATTEMPTS: Final = 5
"""Tries to register when the key keeps appearing and lapsing, before giving up."""
REREGISTER_FIRST_S: Final = 1.0
"""After its session is lost, a broker registers again at once, and while the metadata store
does not answer, again after 1 s, 2, 4 ... up to :data:`REREGISTER_MAX_S`."""
REREGISTER_MAX_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    zone: str | None
    metrics_port: int | None = None
    """Where ``/metrics`` answers on ``host``, if the broker serves it."""
    listeners: tuple[tuple[str, str, int], ...] = ()
    """(listener name, host, port) of every listener, as clients should reach them; the
    main listener (``host``, ``port``) first."""

    def encode(self) -> bytes:
        fields = [
            self.node_id,
            self.host,
            self.port,
            self.zone,
            self.metrics_port,
            [list(listener) for listener in self.listeners],
        ]
        return msgpack.packb(fields)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, value: bytes) -> BrokerInfo:
        # Records of older brokers have fewer fields.
        node_id, host, port, zone, *rest = msgpack.unpackb(value)
        metrics_port = rest[0] if rest else None
        listeners = tuple((str(n), str(h), int(p)) for n, h, p in rest[1]) if len(rest) > 1 else ()
        return cls(node_id, host, port, zone, metrics_port, listeners)

    def endpoint(self, listener: str | None) -> tuple[str, int]:
        """(host, port) of this broker on ``listener``; the main listener's if it has none."""
        for name, host, port in self.listeners:
            if name == listener:
                return host, port
        return self.host, self.port


async def registered_brokers(metadata: MetadataStore) -> list[BrokerInfo]:
    """The brokers registered now (live ones: records vanish with their sessions)."""
    brokers = []
    for record in await metadata.scan(BROKERS, prefix_end(BROKERS)):
        with contextlib.suppress(ValueError, TypeError, msgpack.UnpackException):
            brokers.append(BrokerInfo.decode(record.value))
    return brokers


def _same_address(registered: bytes, me: BrokerInfo) -> bool:
    try:
        other = BrokerInfo.decode(registered)
    except (ValueError, TypeError, msgpack.UnpackException):
        return False
    return (other.host, other.port) == (me.host, me.port)


def client_zone(client_id: str | None) -> str | None:
    """The zone a client names in its ``client.id`` (``…,zone_id=z1,…``), if any."""
    if not client_id:
        return None
    for part in client_id.split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() in ZONE_TOKENS and value.strip():
            return value.strip()
    return None


def rendezvous_owner(key: str, candidates: Sequence[BrokerInfo]) -> BrokerInfo:
    """The candidate with the highest hash of (key, node id): stable as brokers come and go."""
    return max(candidates, key=lambda broker: _score(key, broker))


def balanced_owners(
    topic: str, partitions: int, candidates: Sequence[BrokerInfo]
) -> list[BrokerInfo]:
    """The owner of each of the topic's ``partitions``, spread evenly over ``candidates``: no
    broker owns more than its share rounded up.

    Partitions choose in order, each the broker of the highest rendezvous hash of
    (``topic/partition``, node id) that still has room (rendezvous hashing with bounded
    loads). Every broker computes the same owners from the same live brokers. A broker
    leaving moves its own partitions and, as the others' share grows, a few more: a tenth to
    a third as many again in simulations (plain rendezvous hashing moves only its own, but
    spreads unevenly).
    """
    room = -(-partitions // len(candidates))
    owned = dict.fromkeys((broker.node_id for broker in candidates), 0)
    owners = []
    for partition in range(partitions):
        key = f"{topic}/{partition}"
        with_room = (broker for broker in candidates if owned[broker.node_id] < room)
        owner = max(with_room, key=lambda broker: _score(key, broker))
        owned[owner.node_id] += 1
        owners.append(owner)
    return owners


def _score(key: str, broker: BrokerInfo) -> bytes:
    return hashlib.blake2b(f"{key}\x00{broker.node_id}".encode(), digest_size=8).digest()


class Cluster:
    """This broker's registration and its view of the live brokers."""

    def __init__(self, metadata: MetadataStore, session_ttl: float) -> None:
        self._metadata = metadata
        self._ttl = session_ttl
        self._session: Session | None = None
        self._follower: Follower | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._live: dict[int, BrokerInfo] = {}
        self._owners: OrderedDict[tuple[str, int, tuple[BrokerInfo, ...]], tuple[BrokerInfo, ...]]
        self._owners = OrderedDict()
        """Topics' partition owners by (topic, partitions, candidates), least recently used
        first; at most :data:`OWNERS_CACHED` owners together."""
        self._owners_cached = 0
        self.me: BrokerInfo | None = None
        self.cluster_id = ""

    async def join(
        self,
        host: str,
        port: int,
        zone: str | None,
        node_id: int | None,
        metrics_port: int | None = None,
        listeners: tuple[tuple[str, str, int], ...] = (),
    ) -> BrokerInfo:
        """Register this broker; ``node_id`` ``None`` allocates one."""
        self.cluster_id = await self._cluster_id()
        self._session = await self._metadata.open_session(self._ttl)
        watch = await self._metadata.watch(BROKERS)
        if node_id is None:
            node_id = await self._id_of_address(host, port)
        self.me = BrokerInfo(node_id, host, port, zone, metrics_port, listeners)
        await self._register(self.me, self._session)
        await self._reload()
        self._follower = Follower(watch, self._refresh, "broker-membership")
        self._keeper = asyncio.create_task(self._stay_registered(), name="broker-registration")
        return self.me

    async def _stay_registered(self) -> None:
        """Register again whenever the session is lost (the metadata store was down or paused
        past its ttl, or restarted without it): a broker missing from the registrations is
        missing from every client's metadata, though it serves."""
        assert self.me is not None
        while True:
            assert self._session is not None
            await asyncio.shield(self._session.lost)
            log.warning("broker %d lost its session; registering again", self.me.node_id)
            self._session = await self._register_again(self.me)
            log.info("broker %d is registered again", self.me.node_id)
            with contextlib.suppress(IcefloeError):
                await self._reload()

    async def _register_again(self, me: BrokerInfo) -> Session:
        """A new session holding ``me``'s registration, once the metadata store answers."""
        delay = REREGISTER_FIRST_S
        while True:
            try:
                session = await self._metadata.open_session(self._ttl)
                try:
                    await self._register(me, session)
                except BaseException:
                    await session.close()
                    raise
                return session
            except IcefloeError as exc:  # the store does not answer yet
                log.warning(
                    "broker %d could not register again (%s); retrying in %.0f s",
                    me.node_id,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, REREGISTER_MAX_S)

    async def _id_of_address(self, host: str, port: int) -> int:
        """The node id of the broker at this address: the one it had before, however long it
        was down, as Kafka's brokers keep theirs. Clients keep their connections and the
        coordinators they found per node id; one that never comes back leaves them waiting
        (librdkafka's ``send_offsets_to_transaction`` ignores its timeout then,
        confluentinc/librdkafka#5511)."""
        key = f"{NODE_IDS}{host}:{port}"
        live = {info.node_id: info for info in await registered_brokers(self._metadata)}
        record = await self._metadata.get(key)
        if record is not None:
            with contextlib.suppress(ValueError):
                known = int(record.value)
                other = live.get(known)
                if other is None or (other.host, other.port) == (host, port):
                    return known
                # Since taken by a broker given that id in its configuration.
        # A broker registered here before addresses were recorded keeps its id too.
        before = [info.node_id for info in live.values() if (info.host, info.port) == (host, port)]
        node_id = before[0] if before else await counters.increment(self._metadata, "node-id")
        version = MUST_NOT_EXIST if record is None else record.version
        with contextlib.suppress(ConflictError):  # another process at this address won
            await self._metadata.put(key, str(node_id).encode(), expected_version=version)
        return node_id

    async def _register(self, me: BrokerInfo, session: Session) -> None:
        """Register ``me`` under its node id, taking over the registration its own previous
        process left at the same address (that process is gone: this one holds its port)."""
        key = f"{BROKERS}{me.node_id}"
        for _ in range(REGISTER_ATTEMPTS):
            try:
                await self._metadata.put(
                    key, me.encode(), expected_version=MUST_NOT_EXIST, session=session
                )
                return
            except AlreadyExistsError:
                held = await self._metadata.get(key)
            if held is not None and not _same_address(held.value, me):
                raise IcefloeError(
                    f"broker id {me.node_id} is already registered by a live broker; "
                    "choose another broker.node_id or leave it unset"
                )
            if held is not None:
                log.info("broker %d takes over its registration from before a restart", me.node_id)
                with contextlib.suppress(ConflictError):  # lapsed or taken meanwhile: look again
                    await self._metadata.delete(key, expected_version=held.version)
        raise IcefloeError(f"broker id {me.node_id}: its registration kept changing; start again")

    async def leave(self) -> None:
        """Deregister (closing the session deletes the ephemeral record)."""
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._follower is not None:
            await self._follower.stop()
        if self._session is not None:
            await self._session.close()

    def brokers_for(self, zone: str | None) -> list[BrokerInfo]:
        """Live brokers of ``zone``; all live brokers if the zone has none or is ``None``."""
        everyone = sorted(self._live.values(), key=lambda b: b.node_id)
        if self.me is not None and self.me.node_id not in self._live:
            everyone.append(self.me)  # our own registration may not have been seen yet
        in_zone = [b for b in everyone if zone is not None and b.zone == zone]
        return in_zone or everyone

    def owners(self, topic: str, partitions: int, zone: str | None) -> tuple[BrokerInfo, ...]:
        """The broker that owns each of the topic's ``partitions`` for clients of ``zone``
        (:func:`balanced_owners`)."""
        key = (topic, partitions, tuple(self.brokers_for(zone)))
        owners = self._owners.get(key)
        if owners is not None:
            self._owners.move_to_end(key)
            return owners
        owners = tuple(balanced_owners(topic, partitions, key[2]))
        self._owners[key] = owners
        self._owners_cached += len(owners)
        while self._owners_cached > OWNERS_CACHED and len(self._owners) > 1:
            self._owners_cached -= len(self._owners.popitem(last=False)[1])
        return owners

    def owner(self, topic: str, partitions: int, partition: int, zone: str | None) -> BrokerInfo:
        """The broker that owns ``partition`` of the topic of ``partitions`` for clients of
        ``zone``."""
        return self.owners(topic, partitions, zone)[partition]

    def coordinator(self, group: str, zone: str | None) -> BrokerInfo:
        return rendezvous_owner(f"group/{group}", self.brokers_for(zone))

    def transaction_coordinator(self, transactional_id: str, zone: str | None) -> BrokerInfo:
        return rendezvous_owner(f"transaction/{transactional_id}", self.brokers_for(zone))

    def live(self) -> list[BrokerInfo]:
        """Every live broker, by node id."""
        return self.brokers_for(None)

    async def _reload(self) -> None:
        self._live = {info.node_id: info for info in await registered_brokers(self._metadata)}
        self._owners.clear()  # of brokers that may be gone
        self._owners_cached = 0

    async def _refresh(self, event: WatchEvent) -> None:
        await self._reload()

    async def _cluster_id(self) -> str:
        record = await self._metadata.get(CLUSTER_ID_KEY)
        if record is not None:
            return record.value.decode()
        fresh = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        try:
            await self._metadata.put(
                CLUSTER_ID_KEY, fresh.encode(), expected_version=MUST_NOT_EXIST
            )
            return fresh
        except AlreadyExistsError:
            record = await self._metadata.get(CLUSTER_ID_KEY)
            assert record is not None
            return record.value.decode()
