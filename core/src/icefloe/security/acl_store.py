"""The cluster's ACLs, kept in the metadata store and cached by every broker.

One key per resource pattern holds every entry on it, so creating or deleting ACLs is a
compare-and-set of that key, and a broker's cache follows the store through a watch (a change
made through any broker applies on every broker within the watch's delay). A stored value
that does not decode is skipped with a warning: a broken key must not take the other ACLs'
protection away, nor stop the broker.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Final

import msgpack

from icefloe.errors import ConflictError, CorruptDataError
from icefloe.keyspace import ACLS, prefix_end
from icefloe.ports.metadata import (
    MAX_KEY_BYTES,
    MUST_NOT_EXIST,
    Follower,
    MetadataStore,
    WatchEvent,
)
from icefloe.security.acls import (
    Acl,
    AclFilter,
    Entry,
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourceType,
)

log = logging.getLogger(__name__)

MAX_ACLS: Final = 100_000
"""ACLs the cluster may hold: each broker keeps them all in memory."""
_CAS_ATTEMPTS: Final = 20

_Change = Callable[[frozenset[Entry]], frozenset[Entry]]


class AclStore:
    """Reads and changes ACLs; answers from a cache kept fresh by the store's watch."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata
        self._by_resource: dict[Resource, frozenset[Entry]] = {}
        self._follower: Follower | None = None

    async def start(self) -> None:
        watch = await self._metadata.watch(ACLS)  # before the reload: no change is missed
        await self._reload()
        self._follower = Follower(watch, self._apply, "acl-cache")

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.stop()

    def __len__(self) -> int:
        return sum(len(entries) for entries in self._by_resource.values())

    def covering(self, resource_type: ResourceType, name: str) -> Iterator[Acl]:
        """Every cached ACL whose pattern applies to the resource."""
        for literal in (name, "*"):
            resource = Resource(resource_type, literal, PatternType.LITERAL)
            for entry in self._by_resource.get(resource, ()):
                yield Acl(resource, entry)
        for resource, entries in self._by_resource.items():
            if resource.pattern is PatternType.PREFIXED and resource.covers(resource_type, name):
                for entry in entries:
                    yield Acl(resource, entry)

    def of_type(self, resource_type: ResourceType) -> Iterator[Acl]:
        for resource, entries in self._by_resource.items():
            if resource.type is resource_type:
                for entry in entries:
                    yield Acl(resource, entry)

    def matching(self, acl_filter: AclFilter) -> list[Acl]:
        return [
            acl
            for resource, entries in self._by_resource.items()
            for entry in entries
            if acl_filter.matches(acl := Acl(resource, entry))
        ]

    async def add(self, acls: Iterable[Acl]) -> None:
        """Store the ACLs (those already there stay as they are)."""
        by_resource: dict[Resource, set[Entry]] = {}
        for acl in acls:
            if len(_key(acl.resource).encode()) > MAX_KEY_BYTES:
                raise ValueError(f"resource name {acl.resource.name[:40]!r}… is too long")
            by_resource.setdefault(acl.resource, set()).add(acl.entry)
        for resource, entries in by_resource.items():

            def extend(
                current: frozenset[Entry], added: frozenset[Entry] = frozenset(entries)
            ) -> frozenset[Entry]:
                return current | added

            await self._change(resource, extend)

    async def remove(self, acl_filter: AclFilter) -> list[Acl]:
        """Delete the ACLs the filter matches, as stored now; return them."""
        removed: list[Acl] = []
        for resource in {acl.resource for acl in await self._stored_matching(acl_filter)}:

            def keep(current: frozenset[Entry], resource: Resource = resource) -> frozenset[Entry]:
                gone = {e for e in current if acl_filter.matches(Acl(resource, e))}
                removed.extend(Acl(resource, e) for e in gone)
                return current - gone

            await self._change(resource, keep)
        return removed

    async def _stored_matching(self, acl_filter: AclFilter) -> list[Acl]:
        found: list[Acl] = []
        async for record in self._metadata.scan_all(ACLS, prefix_end(ACLS)):
            try:
                resource, entries = _decode(record.key, record.value)
            except CorruptDataError as exc:
                log.warning("skipping ACL key %s: %s", record.key, exc)
                continue
            found.extend(a for e in entries if acl_filter.matches(a := Acl(resource, e)))
        return found

    async def _change(self, resource: Resource, change: _Change) -> None:
        key = _key(resource)
        for _ in range(_CAS_ATTEMPTS):
            record = await self._metadata.get(key)
            current = frozenset() if record is None else _decode(key, record.value)[1]
            wanted = change(current)
            if wanted == current:
                return
            if len(self) + len(wanted) - len(current) > MAX_ACLS:
                raise ValueError(f"the cluster holds its maximum of {MAX_ACLS} ACLs")
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
                continue  # another broker changed the same resource: redo on its result
            self._remember(resource, wanted)
            return
        raise ConflictError(f"ACLs of {resource} kept changing under {_CAS_ATTEMPTS} attempts")

    def _remember(self, resource: Resource, entries: frozenset[Entry]) -> None:
        if entries:
            self._by_resource[resource] = entries
        else:
            self._by_resource.pop(resource, None)

    async def _reload(self) -> None:
        loaded: dict[Resource, frozenset[Entry]] = {}
        async for record in self._metadata.scan_all(ACLS, prefix_end(ACLS)):
            try:
                resource, entries = _decode(record.key, record.value)
            except CorruptDataError as exc:
                log.warning("skipping ACL key %s: %s", record.key, exc)
                continue
            loaded[resource] = entries
        self._by_resource = loaded

    async def _apply(self, event: WatchEvent) -> None:
        if event.key is None:  # RESET
            await self._reload()
            return
        record = await self._metadata.get(event.key)
        resource, entries = (
            _decode(event.key, record.value)
            if record is not None
            else (_resource_of(event.key), frozenset[Entry]())
        )
        self._remember(resource, entries)


def _key(resource: Resource) -> str:
    name = urllib.parse.quote(resource.name, safe="")
    return f"{ACLS}{resource.type.name.lower()}/{resource.pattern.name.lower()}/{name}"


def _resource_of(key: str) -> Resource:
    try:
        kind, pattern, name = key.removeprefix(ACLS).split("/")
        return Resource(
            ResourceType[kind.upper()],
            urllib.parse.unquote(name, errors="strict"),
            PatternType[pattern.upper()],
        )
    except (ValueError, KeyError, UnicodeDecodeError) as exc:
        raise CorruptDataError(f"not an ACL key: {key!r}") from exc


def _encode(entries: frozenset[Entry]) -> bytes:
    rows = sorted((e.principal, e.host, int(e.operation), int(e.permission)) for e in entries)
    packed: bytes = msgpack.packb(rows)
    return packed


def _decode(key: str, value: bytes) -> tuple[Resource, frozenset[Entry]]:
    resource = _resource_of(key)
    try:
        rows = msgpack.unpackb(value)
        entries = frozenset(
            Entry(str(principal), str(host), Operation(operation), Permission(permission))
            for principal, host, operation, permission in rows
        )
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CorruptDataError(f"unreadable ACLs under {key}: {exc}") from exc
    return resource, entries
