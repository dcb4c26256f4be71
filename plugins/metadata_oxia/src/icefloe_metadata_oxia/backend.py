"""The port's primitives as Oxia requests (loaded by :meth:`OxiaMetadataStore.open`).

Versions are Oxia version ids plus one: a version id is the offset of the write in its shard's
log, so it grows with every write to a key (deletes included), but the first write of a shard
has offset 0 and port versions are positive. Keys never move between shards (see
:mod:`~icefloe_metadata_oxia.keys`), so per-key versions stay monotonic with several shards.

Oxia has no multi-key transactions: the adapter does not declare ``MULTI_KEY_TRANSACTION``.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator
from typing import Final, Self

from icefloe.errors import (
    AlreadyExistsError,
    ClosedError,
    ConflictError,
    SessionExpiredError,
    StorageError,
)
from icefloe.ports.metadata import MUST_NOT_EXIST, Record, Session, Watch
from icefloe_metadata_oxia._proto import client_pb2 as pb
from icefloe_metadata_oxia.connection import OxiaConnection, Shard
from icefloe_metadata_oxia.keys import KeySpace
from icefloe_metadata_oxia.options import OxiaMetadataOptions
from icefloe_metadata_oxia.session import OxiaSession
from icefloe_metadata_oxia.watch import OxiaWatch

_DELETE_BATCH: Final = 500
"""Keys deleted per write by ``delete_range``; bounds the size of one request."""


def _version(version: pb.Version) -> int:
    return version.version_id + 1


def _expected(expected_version: int | None) -> int | None:
    if expected_version is None or expected_version == MUST_NOT_EXIST:
        return expected_version
    return expected_version - 1


class OxiaBackend:
    """A connected Oxia namespace, speaking the port's primitives."""

    def __init__(self, options: OxiaMetadataOptions, connection: OxiaConnection) -> None:
        """Use :meth:`open`."""
        self._options = options
        self._connection = connection
        self._keys = KeySpace(options.namespace)
        self._closed = False
        self._watches: set[OxiaWatch] = set()
        self._sessions: set[OxiaSession] = set()

    @classmethod
    async def connect(cls, options: OxiaMetadataOptions) -> Self:
        """Connect to Oxia and learn its shards.

        Raises:
            UnavailableError: no server answered within ``connect_timeout``.
        """
        return cls(options, await OxiaConnection.connect(options))

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("Oxia metadata store is closed; open a new one")

    def _shard(self, key: str) -> Shard:
        self._check_open()
        return self._connection.shard_for(self._keys.partition(key))

    def _record(self, stored: str, value: bytes, version: pb.Version) -> Record:
        key = self._keys.key_of(stored)
        if key is None:
            raise StorageError(f"Oxia returned {stored!r}, a key outside this namespace")
        return Record(key, value, _version(version))

    # --- key-value primitives -----------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        shard = self._shard(key)
        request = pb.GetRequest(key=self._keys.stored(key), include_value=True)
        response = await self._connection.get(shard, request, f"get {key!r}")
        if response.status == pb.Status.KEY_NOT_FOUND:
            return None
        _check(response.status, key)
        return Record(key, response.value, _version(response.version))

    async def put(
        self, key: str, value: bytes, expected_version: int | None, session: Session | None
    ) -> Record:
        shard = self._shard(key)
        request = pb.PutRequest(
            key=self._keys.stored(key),
            value=value,
            partition_key=self._keys.partition(key),
            expected_version_id=_expected(expected_version),
        )
        owner = None
        if session is not None:
            owner = self._own(session)
            request.session_id = await owner.oxia_id(shard)
            request.client_identity = owner.client_identity
        write = pb.WriteRequest(puts=[request])
        response = (await self._connection.write(shard, write, f"put {key!r}")).puts[0]
        if response.status == pb.Status.SESSION_DOES_NOT_EXIST and owner is not None:
            owner.expire()
        conflict = response.status == pb.Status.UNEXPECTED_VERSION_ID
        if conflict and expected_version == MUST_NOT_EXIST:
            raise AlreadyExistsError(f"{key!r} already exists")
        _check(response.status, key, expected_version)
        return Record(key, value, _version(response.version))

    async def delete(self, key: str, expected_version: int | None) -> bool:
        shard = self._shard(key)
        request = pb.DeleteRequest(
            key=self._keys.stored(key), expected_version_id=_expected(expected_version)
        )
        write = pb.WriteRequest(deletes=[request])
        status = (await self._connection.write(shard, write, f"delete {key!r}")).deletes[0].status
        if status == pb.Status.KEY_NOT_FOUND and expected_version is None:
            return False
        _check(status, key, expected_version)
        return True

    async def delete_range(self, start: str, end: str) -> None:
        # Key by key rather than Oxia's DeleteRange: watchers then see one DELETE per key
        # instead of an unspecific range event.
        self._check_open()
        low, high = self._keys.bound(start), self._keys.bound(end)
        for shard in self._connection.shards():
            stored = await self._connection.list_keys(shard, low, high, "list for delete_range")
            ours = [key for key in stored if self._keys.key_of(key) is not None]
            for first in range(0, len(ours), _DELETE_BATCH):
                batch = ours[first : first + _DELETE_BATCH]
                write = pb.WriteRequest(deletes=[pb.DeleteRequest(key=key) for key in batch])
                await self._connection.write(shard, write, "delete_range")

    # --- ordered reads ------------------------------------------------------------------------

    async def scan(self, start: str, end: str, limit: int | None) -> list[Record]:
        self._check_open()
        low, high = self._keys.bound(start), self._keys.bound(end)
        per_shard = [
            self._shard_scan(shard, low, high, limit) for shard in self._connection.shards()
        ]
        # Encoded keys sort like the port keys, so merging by stored key is key order.
        lists = await asyncio.gather(*per_shard)
        merged = heapq.merge(*lists, key=lambda record: record.key)
        return list(merged)[:limit] if limit is not None else list(merged)

    async def _shard_scan(
        self, shard: Shard, low: str, high: str, limit: int | None
    ) -> list[Record]:
        records: list[Record] = []
        scan: AsyncIterator[pb.GetResponse] = self._connection.range_scan(shard, low, high, "scan")
        async for found in scan:
            if self._keys.key_of(found.key) is None:
                continue
            records.append(self._record(found.key, found.value, found.version))
            if limit is not None and len(records) >= limit:
                break
        return records

    async def floor(self, key: str) -> Record | None:
        return await self._nearest(key, pb.KeyComparisonType.FLOOR, highest=True)

    async def ceiling(self, key: str) -> Record | None:
        return await self._nearest(key, pb.KeyComparisonType.CEILING, highest=False)

    async def _nearest(
        self,
        key: str,
        comparison: pb.KeyComparisonType,
        *,
        highest: bool,
    ) -> Record | None:
        """Each shard's nearest key, then the nearest of those."""
        self._check_open()
        request = pb.GetRequest(
            key=self._keys.stored(key), include_value=True, comparison_type=comparison
        )
        responses = await asyncio.gather(
            *(
                self._connection.get(shard, request, f"floor/ceiling {key!r}")
                for shard in self._connection.shards()
            )
        )
        found = [
            self._record(response.key, response.value, response.version)
            for response in responses
            if response.status == pb.Status.OK and self._keys.key_of(response.key) is not None
        ]
        for response in responses:
            if response.status != pb.Status.KEY_NOT_FOUND:
                _check(response.status, key)
        if not found:
            return None
        return (max if highest else min)(found, key=lambda record: record.key)

    # --- sequences ----------------------------------------------------------------------------

    async def append_sequence(self, prefix: str, value: bytes, deltas: tuple[int, ...]) -> Record:
        # The server picks the key: the previous highest key of the sequence plus the deltas,
        # atomically in the shard that owns the sequence's partition key.
        shard = self._shard(prefix)
        request = pb.PutRequest(
            key=self._keys.stored(prefix),
            value=value,
            partition_key=self._keys.partition(prefix),
            sequence_key_delta=deltas,
        )
        write = pb.WriteRequest(puts=[request])
        response = (await self._connection.write(shard, write, f"append to {prefix!r}")).puts[0]
        _check(response.status, prefix)
        return self._record(response.key, value, response.version)

    # --- notifications and sessions -----------------------------------------------------------

    async def watch(self, prefix: str) -> Watch:
        self._check_open()
        watch = await OxiaWatch.open(
            self._connection, self._keys, prefix, self._options.watch_queue_size
        )
        if self._closed:  # close() ran while the streams were starting
            await watch.close()
            raise ClosedError("Oxia metadata store is closed; open a new one")
        self._watches.add(watch)
        return watch

    async def open_session(self, ttl: float) -> Session:
        self._check_open()
        session = await OxiaSession.open(self._connection, ttl)
        self._sessions.add(session)
        session.lost.add_done_callback(lambda _: self._sessions.discard(session))
        return session

    def _own(self, session: Session) -> OxiaSession:
        if not isinstance(session, OxiaSession) or session not in self._sessions:
            if isinstance(session, OxiaSession) and not session.alive:
                raise SessionExpiredError(f"session {session.id} is closed or expired")
            raise ValueError(f"session {session.id} was not opened by this metadata store")
        return session

    # --- lifecycle ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Close sessions (deleting their keys), end watches, close the channels; idempotent."""
        if self._closed:
            return
        self._closed = True
        for session in list(self._sessions):
            await session.close()
        for watch in list(self._watches):
            await watch.close()
        self._watches.clear()
        await self._connection.close()


def _check(status: int, key: str, expected_version: int | None = None) -> None:
    if status == pb.Status.OK:
        return
    if status == pb.Status.UNEXPECTED_VERSION_ID or (
        status == pb.Status.KEY_NOT_FOUND and expected_version is not None
    ):
        raise ConflictError(f"{key!r} does not have version {expected_version}")
    if status == pb.Status.SESSION_DOES_NOT_EXIST:
        raise SessionExpiredError(f"the session of {key!r} has expired; open a new session")
    raise StorageError(f"Oxia answered {pb.Status.Name(status)} for {key!r}")
