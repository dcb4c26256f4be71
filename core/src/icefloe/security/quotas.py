"""Client quotas as Kafka defines them: who they apply to, what they limit, where they live.

A quota entity names a ``user``, a ``client-id`` or both, each either a name or the default
(``None``, Kafka's ``<default>``). Its values are Kafka's quota keys: ``producer_byte_rate``
and ``consumer_byte_rate`` (bytes per second), ``request_percentage`` (percent of one request
handler's time) and ``controller_mutation_rate`` (partitions created or deleted per second).

A client (its user principal and client id) gets, for each key separately, the value of the
first of Kafka's eight levels that sets it:

1. ``/config/users/<user>/clients/<client-id>``
2. ``/config/users/<user>/clients/<default>``
3. ``/config/users/<user>``
4. ``/config/users/<default>/clients/<client-id>``
5. ``/config/users/<default>/clients/<default>``
6. ``/config/users/<default>``
7. ``/config/clients/<client-id>``
8. ``/config/clients/<default>``

The level also says whose usage the quota measures (Kafka's metric tags): a quota on a user
alone (levels 3 and 6) is shared by all that user's client ids, a quota on client ids alone
(levels 7 and 8) by all users of the client id, and the others by the pair; a default applies
to each user or client id separately, never to all of them together.

The quotas live in the metadata store, one key per entity, and every broker caches them all
and follows the store's watch, so a change made through any broker applies on each within
moments. A stored value that does not decode is skipped with a warning.
"""

from __future__ import annotations

import logging
import math
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

import msgpack

from icefloe.errors import ConflictError, CorruptDataError
from icefloe.keyspace import QUOTAS, prefix_end
from icefloe.ports.metadata import (
    MAX_KEY_BYTES,
    MUST_NOT_EXIST,
    Follower,
    MetadataStore,
    WatchEvent,
)

log = logging.getLogger(__name__)

USER: Final = "user"
CLIENT_ID: Final = "client-id"
IP: Final = "ip"
"""Kafka's third entity type (connection-rate quotas): known to filters, never stored here."""

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_PERCENTAGE: Final = "request_percentage"
CONTROLLER_MUTATION_RATE: Final = "controller_mutation_rate"

QUOTA_KEYS: Final[Mapping[str, bool]] = {
    PRODUCER_BYTE_RATE: True,
    CONSUMER_BYTE_RATE: True,
    REQUEST_PERCENTAGE: False,
    CONTROLLER_MUTATION_RATE: False,
}
"""The keys a user or client-id entity may set, and whether each is integral (Kafka's LONG)
rather than a DOUBLE."""

_LONG_MAX: Final = float(2**63 - 1)
MAX_ENTITIES: Final = 100_000
"""Quota entities the cluster may hold: each broker keeps them all in memory."""
_CAS_ATTEMPTS: Final = 20
_DEFAULT_SEGMENT: Final = "<default>"
"""The default's place in a key: percent-encoding never yields ``<``, so no name collides."""

Entity = tuple[tuple[str, str | None], ...]
"""A quota entity: (entity type, name or ``None`` for the default) pairs sorted by type, as
Kafka's ``ClientQuotaEntity`` maps them."""

Tags = tuple[str, str]
"""(user, client id) whose usage a quota measures; ``""`` where it does not look."""


class QuotaError(ValueError):
    """A request Kafka refuses: INVALID_REQUEST, or UNSUPPORTED_VERSION if ``unsupported``."""

    def __init__(self, message: str, *, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def entity(user: str | bool | None = False, client_id: str | bool | None = False) -> Entity:
    """An entity from its parts: a name, ``None`` for the default, ``False`` for absent."""
    parts: list[tuple[str, str | None]] = []
    if client_id is not False:
        parts.append((CLIENT_ID, None if client_id is None else str(client_id)))
    if user is not False:
        parts.append((USER, None if user is None else str(user)))
    return tuple(parts)


def describe_entity(value: Entity) -> str:
    """Kafka's way of naming an entity in messages, e.g. ``user alice client-id <default>``."""
    return " ".join(f"{kind} {_DEFAULT_SEGMENT if name is None else name}" for kind, name in value)


def validated_entity(parts: list[tuple[str, str | None]]) -> Entity:
    """The entity an AlterClientQuotas entry names, checked as Kafka's controller checks it.

    Raises:
        QuotaError: the entity is empty, repeats a type, names an unknown type or an empty
            name, or is an ``ip`` entity (connection-rate quotas are not supported here).
    """
    if not parts:
        raise QuotaError("Invalid empty client quota entity")
    seen: dict[str, str | None] = {}
    for kind, name in parts:
        if kind in seen:
            raise QuotaError(f"Invalid client quota entity, duplicate entity entry {kind}")
        if kind not in (USER, CLIENT_ID, IP):
            raise QuotaError(f"Unhandled client quota entity type: {kind}")
        if name is not None and not name:
            raise QuotaError(f"Empty {kind} not supported")
        seen[kind] = name
    if IP in seen:
        raise QuotaError(
            "ip quotas (connection_creation_rate) are not supported: quotas apply to user "
            "and client-id entities"
        )
    value = tuple(sorted(seen.items()))
    if not key_fits(value):
        raise QuotaError(f"the entity's names are too long to store ({MAX_KEY_BYTES} bytes)")
    return value


def validated_value(key: str, value: float) -> float:
    """A quota value to set, checked as Kafka's controller checks it.

    Raises:
        QuotaError: an unknown key, a value that is not a positive finite number, or a
            fractional value for a byte rate.
    """
    integral = QUOTA_KEYS.get(key)
    if integral is None:
        raise QuotaError(f"Invalid configuration key {key}")
    if math.isnan(value) or math.isinf(value):
        raise QuotaError(f"Quota {key} must be a finite number")
    if value <= 0.0:
        raise QuotaError(f"Quota {key} must be greater than 0")
    if integral:
        if value > _LONG_MAX:
            raise QuotaError(f"Proposed value for {key} is too large for a LONG.")
        if abs(value % 1.0) > 1e-6:
            raise QuotaError(f"{key} cannot be a fractional value.")
    return float(value)


@dataclass(frozen=True, slots=True)
class QuotaFilter:
    """DescribeClientQuotas' filter: entity types that must have a given name (``None``: the
    default), types that must be present with any name, and whether an entity may name other
    types besides (not ``strict``)."""

    exact: Mapping[str, str | None]
    present: frozenset[str]
    strict: bool

    @classmethod
    def of(cls, components: list[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
        """The filter of a request's (entity type, match type, match) components.

        Raises:
            QuotaError: as Kafka's broker refuses the filter.
        """
        exact: dict[str, str | None] = {}
        present: set[str] = set()
        for kind, match_type, match in components:
            if not kind:
                raise QuotaError("Invalid empty entity type.")
            if kind in exact or kind in present:
                raise QuotaError(f"Entity type {kind} cannot appear more than once in the filter.")
            if kind not in (USER, CLIENT_ID, IP):
                raise QuotaError(f"Unsupported entity type {kind}", unsupported=True)
            if match_type == 0:
                if match is None:
                    raise QuotaError(
                        "Request specified MATCH_TYPE_EXACT, but set match string to null."
                    )
                exact[kind] = match
            elif match_type == 1:
                if match is not None:
                    raise QuotaError(
                        "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."
                    )
                exact[kind] = None
            elif match_type == 2:
                if match is not None:
                    raise QuotaError(
                        "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."
                    )
                present.add(kind)
            else:
                raise QuotaError(f"Unknown match type {match_type}")
        if (IP in exact or IP in present) and ({USER, CLIENT_ID} & (exact.keys() | present)):
            raise QuotaError(
                "Invalid entity filter component combination. IP filter component should not "
                "be used with user or clientId filter component."
            )
        return cls(exact, frozenset(present), strict)

    def matches(self, value: Entity) -> bool:
        parts = dict(value)
        if self.strict and len(parts) != len(self.exact) + len(self.present):
            return False
        for kind, name in self.exact.items():
            if kind not in parts or parts[kind] != name:
                return False
        return all(kind in parts for kind in self.present)


def levels(user: str, client_id: str) -> tuple[tuple[Entity, Tags], ...]:
    """Kafka's eight levels for a client, most specific first, each with the usage it
    measures."""
    pair = (user, client_id)
    return (
        (((CLIENT_ID, client_id), (USER, user)), pair),
        (((CLIENT_ID, None), (USER, user)), pair),
        (((USER, user),), (user, "")),
        (((CLIENT_ID, client_id), (USER, None)), pair),
        (((CLIENT_ID, None), (USER, None)), pair),
        (((USER, None),), (user, "")),
        (((CLIENT_ID, client_id),), ("", client_id)),
        (((CLIENT_ID, None),), ("", client_id)),
    )


class QuotaStore:
    """Reads and changes quotas; answers from a cache kept fresh by the store's watch."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata
        self._quotas: dict[Entity, dict[str, float]] = {}
        self._follower: Follower | None = None
        self.generation = 0
        """Advances at every change of the cache, so that what was derived from it can tell
        it is stale."""
        self.configured = False
        """Whether any quota is set (enforcement costs nothing while none is)."""

    async def start(self) -> None:
        watch = await self._metadata.watch(QUOTAS)  # before the reload: no change is missed
        await self._reload()
        self._follower = Follower(watch, self._apply, "quota-cache")

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None

    def __len__(self) -> int:
        return len(self._quotas)

    def items(self) -> Iterator[tuple[Entity, Mapping[str, float]]]:
        yield from self._quotas.items()

    def get(self, value: Entity) -> Mapping[str, float]:
        return self._quotas.get(value, {})

    def limit(self, user: str, client_id: str, key: str) -> tuple[float, Tags] | None:
        """The quota ``key`` a client gets and whose usage it measures, or ``None``."""
        quotas = self._quotas
        for level, tags in levels(user, client_id):
            values = quotas.get(level)
            if values is not None:
                found = values.get(key)
                if found is not None:
                    return found, tags
        return None

    async def alter(self, value: Entity, changes: Mapping[str, float | None]) -> None:
        """Set (a number) or remove (``None``) quota keys of one entity.

        Raises:
            QuotaError: the cluster holds its maximum of entities already.
            ConflictError: the entity kept changing under every attempt.
        """
        key = _key(value)
        for _ in range(_CAS_ATTEMPTS):
            record = await self._metadata.get(key)
            current = {} if record is None else _decode(key, record.value)[1]
            wanted = dict(current)
            for name, number in changes.items():
                if number is None:
                    wanted.pop(name, None)
                else:
                    wanted[name] = number
            if wanted == current:
                return
            if record is None and len(self._quotas) >= MAX_ENTITIES:
                raise QuotaError(f"the cluster holds its maximum of {MAX_ENTITIES} quota entities")
            try:
                if not wanted:
                    if record is not None:
                        await self._metadata.delete(key, expected_version=record.version)
                else:
                    await self._metadata.put(
                        key,
                        _encode(wanted),
                        expected_version=MUST_NOT_EXIST if record is None else record.version,
                    )
            except ConflictError:
                continue  # another broker changed the same entity: redo on its result
            self._remember(value, wanted)
            return
        raise ConflictError(f"quotas of {describe_entity(value)} kept changing")

    def _remember(self, value: Entity, quotas: dict[str, float]) -> None:
        if quotas:
            self._quotas[value] = quotas
        else:
            self._quotas.pop(value, None)
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        self.configured = bool(self._quotas)

    async def _reload(self) -> None:
        loaded: dict[Entity, dict[str, float]] = {}
        async for record in self._metadata.scan_all(QUOTAS, prefix_end(QUOTAS)):
            try:
                value, quotas = _decode(record.key, record.value)
            except CorruptDataError as exc:
                log.warning("skipping quota key %s: %s", record.key, exc)
                continue
            if quotas:
                loaded[value] = quotas
        self._quotas = loaded
        self._changed()

    async def _apply(self, event: WatchEvent) -> None:
        if event.key is None:  # RESET
            await self._reload()
            return
        record = await self._metadata.get(event.key)
        if record is None:
            self._remember(entity_of(event.key), {})
        else:
            self._remember(*_decode(event.key, record.value))


def key_fits(value: Entity) -> bool:
    """Whether the entity's key fits the metadata store (names of non-ASCII characters grow
    when percent-encoded)."""
    return len(_key(value).encode()) <= MAX_KEY_BYTES


def _segment(name: str | None) -> str:
    return _DEFAULT_SEGMENT if name is None else urllib.parse.quote(name, safe="")


def _key(value: Entity) -> str:
    parts = dict(value)
    path: tuple[str, ...] = ()
    for kind in (USER, CLIENT_ID):  # the user first, as Kafka's /config/users/<u>/clients/<c>
        if kind in parts:
            path += (kind, _segment(parts[kind]))
    return QUOTAS + "/".join(path)


def entity_of(key: str) -> Entity:
    """The entity a quota key holds.

    Raises:
        CorruptDataError: the key is not one this module writes.
    """
    segments = key.removeprefix(QUOTAS).split("/")
    parts: dict[str, str | None] = {}
    try:
        if len(segments) not in (2, 4):
            raise ValueError("wrong number of segments")
        for kind, name in zip(segments[::2], segments[1::2], strict=True):
            if kind not in (USER, CLIENT_ID) or kind in parts or (kind == USER and parts):
                raise ValueError("unknown or repeated entity type, or types out of order")
            parts[kind] = (
                None if name == _DEFAULT_SEGMENT else urllib.parse.unquote(name, errors="strict")
            )
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptDataError(f"not a quota key: {key!r}") from exc
    return tuple(sorted(parts.items()))


def _encode(quotas: Mapping[str, float]) -> bytes:
    packed: bytes = msgpack.packb(dict(sorted(quotas.items())))
    return packed


def _decode(key: str, value: bytes) -> tuple[Entity, dict[str, float]]:
    parsed = entity_of(key)
    try:
        raw = msgpack.unpackb(value)
        quotas = {str(name): float(number) for name, number in raw.items()}
        # Only values this module would write: enforcement divides by them.
        quotas = {
            name: number
            for name, number in quotas.items()
            if name in QUOTA_KEYS and math.isfinite(number) and number > 0
        }
    except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"unreadable quotas under {key}: {exc}") from exc
    return parsed, quotas
