"""Broker membership and zone-aware routing.

Each broker registers an ephemeral record (id, host, port, zone) under ``brokers/`` through a
metadata-store session, so a dead broker disappears by itself. Routing is advisory: the broker a
client is told owns a partition is chosen by rendezvous hashing over the live brokers of the
client's zone (all brokers when its zone has none), which keeps a partition's traffic on one
broker per zone for cache locality. Any broker still serves any partition.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import uuid
from dataclasses import dataclass
from typing import Final

import msgpack

from icefloe.errors import AlreadyExistsError, IcefloeError
from icefloe.keyspace import BROKERS, CLUSTER, prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, Follower, MetadataStore, Session, WatchEvent
from icefloe.storage import counters

log = logging.getLogger(__name__)

CLUSTER_ID_KEY: Final = CLUSTER + "id"
ZONE_TOKENS: Final = ("zone_id", "ws_az", "warpstream_az", "zone", "automq_az")
"""``client.id`` keys that name the client's zone (Ursa's, WarpStream's and AutoMQ's)."""


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


def client_zone(client_id: str | None) -> str | None:
    """The zone a client names in its ``client.id`` (``…,zone_id=z1,…``), if any."""
    if not client_id:
        return None
    for part in client_id.split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() in ZONE_TOKENS and value.strip():
            return value.strip()
    return None


def rendezvous_owner(key: str, candidates: list[BrokerInfo]) -> BrokerInfo:
    """The candidate with the highest hash of (key, node id): stable as brokers come and go."""

    def score(broker: BrokerInfo) -> bytes:
        return hashlib.blake2b(f"{key}\x00{broker.node_id}".encode(), digest_size=8).digest()

    return max(candidates, key=score)


class Cluster:
    """This broker's registration and its view of the live brokers."""

    def __init__(self, metadata: MetadataStore, session_ttl: float) -> None:
        self._metadata = metadata
        self._ttl = session_ttl
        self._session: Session | None = None
        self._follower: Follower | None = None
        self._live: dict[int, BrokerInfo] = {}
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
        chosen = (
            node_id if node_id is not None else await counters.increment(self._metadata, "node-id")
        )
        self.me = BrokerInfo(chosen, host, port, zone, metrics_port, listeners)
        try:
            await self._metadata.put(
                f"{BROKERS}{chosen}",
                self.me.encode(),
                expected_version=MUST_NOT_EXIST,
                session=self._session,
            )
        except AlreadyExistsError:
            raise IcefloeError(
                f"broker id {chosen} is already registered by a live broker; "
                "choose another broker.node_id or leave it unset"
            ) from None
        await self._reload()
        self._follower = Follower(watch, self._refresh, "broker-membership")
        return self.me

    async def leave(self) -> None:
        """Deregister (closing the session deletes the ephemeral record)."""
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

    def owner(self, topic: str, partition: int, zone: str | None) -> BrokerInfo:
        return rendezvous_owner(f"{topic}/{partition}", self.brokers_for(zone))

    def coordinator(self, group: str, zone: str | None) -> BrokerInfo:
        return rendezvous_owner(f"group/{group}", self.brokers_for(zone))

    def transaction_coordinator(self, transactional_id: str, zone: str | None) -> BrokerInfo:
        return rendezvous_owner(f"transaction/{transactional_id}", self.brokers_for(zone))

    def live(self) -> list[BrokerInfo]:
        """Every live broker, by node id."""
        return self.brokers_for(None)

    async def _reload(self) -> None:
        self._live = {info.node_id: info for info in await registered_brokers(self._metadata)}

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
