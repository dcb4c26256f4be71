"""The port's primitives as etcd requests (loaded by :meth:`EtcdMetadataStore.open`).

Versions are etcd *mod revisions*: the cluster-wide revision of the write that last changed the
key, so they grow with every write and a delete-then-put gets a greater one. Conditional writes
are transactions comparing the key's mod revision (or its version, 0 meaning "absent").

Sequenced append is an optimistic transaction: with ``last`` the sequence's highest key, write
``last + deltas`` if ``last`` still has the mod revision we saw and no key lies after it in the
sequence (a range comparison: every key in ``(last, end of sequence)`` has version 0, which an
empty range satisfies). Two appenders that saw the same ``last`` cannot both win, whatever their
deltas. A loser's transaction returns the sequence's new highest key in the same round trip,
and the last key seen per sequence is cached, so an uncontended append is one request.

Appends to one sequence from this process are group-committed: while a transaction is in
flight, later appends wait, then go together in the next transaction (consecutive keys, one
condition). Racing each other instead, 64 concurrent appenders mostly lose and retry.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final, Self

from aetcd import rpc  # type: ignore[import-untyped]

from icefloe.errors import (
    AlreadyExistsError,
    ClosedError,
    ConflictError,
    SessionExpiredError,
    StorageError,
)
from icefloe.ports.metadata import (
    MUST_NOT_EXIST,
    Check,
    Delete,
    Put,
    Record,
    Session,
    Watch,
    sequence_components,
    sequence_key,
    validate_key,
)
from icefloe_metadata_etcd.connection import EtcdConnection
from icefloe_metadata_etcd.keys import KeySpace
from icefloe_metadata_etcd.options import EtcdMetadataOptions
from icefloe_metadata_etcd.session import EtcdSession
from icefloe_metadata_etcd.watch import EtcdWatch

_SCAN_PAGE: Final = 1000
"""Records per range request of an unlimited scan; bounds one response's size."""
_APPEND_BATCH: Final = 100
"""Appends committed by one transaction: etcd allows 128 operations per transaction."""
_SEQUENCE_CACHE: Final = 10_000
"""Sequences whose last key is remembered (least recently appended ones are forgotten)."""
# ":" is the character after "9": the keys of sequence p lie in [p + "-0", p + "-:").
_SEQUENCE_LOW: Final = "-0"
_SEQUENCE_HIGH: Final = "-:"

_Last = tuple[str, int] | None
"""A sequence's highest key and its mod revision, or ``None`` for an empty sequence."""


@dataclass(frozen=True, slots=True)
class _Append:
    value: bytes
    deltas: tuple[int, ...]
    answer: asyncio.Future[Record]


@dataclass
class _AppendQueue:
    """Appends to one sequence waiting for the transaction that commits them."""

    waiting: list[_Append] = field(default_factory=list)
    committer: asyncio.Task[None] | None = None


def _record(keyspace: KeySpace, kv: Any) -> Record:
    return Record(keyspace.key_of(kv.key), kv.value, kv.mod_revision)


def _compare(key: bytes, version: int) -> Any:
    """The transaction condition "``key`` has ``version``" (or is absent)."""
    if version == MUST_NOT_EXIST:
        return rpc.Compare(key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.VERSION, version=0)
    return rpc.Compare(
        key=key, result=rpc.Compare.EQUAL, target=rpc.Compare.MOD, mod_revision=version
    )


class EtcdBackend:
    """A connected etcd namespace, speaking the port's primitives."""

    def __init__(self, options: EtcdMetadataOptions, connection: EtcdConnection) -> None:
        """Use :meth:`connect`."""
        self._options = options
        self._connection = connection
        self._kv = connection.kv
        self._keys = KeySpace(options.namespace)
        self._closed = False
        self._watches: set[EtcdWatch] = set()
        self._sessions: set[EtcdSession] = set()
        self._last_keys: OrderedDict[str, _Last] = OrderedDict()
        self._appends: dict[str, _AppendQueue] = {}

    @classmethod
    async def connect(cls, options: EtcdMetadataOptions) -> Self:
        return cls(options, await EtcdConnection.connect(options))

    def _is_closed(self) -> bool:
        return self._closed

    async def _call(self, method: Any, request: Any, what: str) -> Any:
        if self._closed:
            raise ClosedError("etcd metadata store is closed; open a new one")
        return await self._connection.call(method, request, what)

    # --- key-value primitives -----------------------------------------------------------------

    async def get(self, key: str) -> Record | None:
        response = await self._call(
            self._kv.Range, rpc.RangeRequest(key=self._keys.stored(key)), f"get {key!r}"
        )
        return _record(self._keys, response.kvs[0]) if response.kvs else None

    async def put(
        self, key: str, value: bytes, expected_version: int | None, session: Session | None
    ) -> Record:
        stored = self._keys.stored(key)
        lease = 0
        if session is not None:
            owner = self._own(session)
            if not owner.alive:
                raise SessionExpiredError(f"session {owner.id} is closed or expired")
            lease = owner.lease_id
        put = rpc.PutRequest(key=stored, value=value, lease=lease)
        try:
            if expected_version is None:
                response = await self._call(self._kv.Put, put, f"put {key!r}")
                return Record(key, value, response.header.revision)
            txn = rpc.TxnRequest(
                compare=[_compare(stored, expected_version)],
                success=[rpc.RequestOp(request_put=put)],
            )
            response = await self._call(self._kv.Txn, txn, f"put {key!r}")
        except SessionExpiredError:
            if session is not None:
                self._own(session).expire()
            raise
        if not response.succeeded:
            if expected_version == MUST_NOT_EXIST:
                raise AlreadyExistsError(f"{key!r} already exists")
            raise ConflictError(f"{key!r} does not have version {expected_version}")
        return Record(key, value, response.header.revision)

    async def delete(self, key: str, expected_version: int | None) -> bool:
        request = rpc.DeleteRangeRequest(key=self._keys.stored(key))
        if expected_version is None:
            response = await self._call(self._kv.DeleteRange, request, f"delete {key!r}")
            return bool(response.deleted)
        txn = rpc.TxnRequest(
            compare=[_compare(self._keys.stored(key), expected_version)],
            success=[rpc.RequestOp(request_delete_range=request)],
        )
        response = await self._call(self._kv.Txn, txn, f"delete {key!r}")
        if not response.succeeded:
            raise ConflictError(f"{key!r} does not have version {expected_version}")
        return True

    async def delete_range(self, start: str, end: str) -> None:
        request = rpc.DeleteRangeRequest(
            key=self._keys.stored(start), range_end=self._keys.stored(end)
        )
        await self._call(self._kv.DeleteRange, request, "delete_range")

    # --- ordered reads ------------------------------------------------------------------------

    async def scan(self, start: str, end: str, limit: int | None) -> list[Record]:
        records: list[Record] = []
        low, high = self._keys.stored(start), self._keys.stored(end)
        while limit is None or len(records) < limit:
            page = _SCAN_PAGE if limit is None else min(_SCAN_PAGE, limit - len(records))
            request = rpc.RangeRequest(key=low, range_end=high, limit=page)
            response = await self._call(self._kv.Range, request, "scan")
            records.extend(_record(self._keys, kv) for kv in response.kvs)
            if not response.more or not response.kvs:
                break
            low = response.kvs[-1].key + b"\x00"
        return records

    async def floor(self, key: str) -> Record | None:
        request = rpc.RangeRequest(
            key=self._keys.start,
            range_end=self._keys.stored(key) + b"\x00",
            limit=1,
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.KEY,
        )
        response = await self._call(self._kv.Range, request, f"floor {key!r}")
        return _record(self._keys, response.kvs[0]) if response.kvs else None

    async def ceiling(self, key: str) -> Record | None:
        request = rpc.RangeRequest(key=self._keys.stored(key), range_end=self._keys.end, limit=1)
        response = await self._call(self._kv.Range, request, f"ceiling {key!r}")
        return _record(self._keys, response.kvs[0]) if response.kvs else None

    # --- sequences ----------------------------------------------------------------------------

    def _last_key_request(self, prefix: str) -> Any:
        return rpc.RangeRequest(
            key=self._keys.stored(prefix + _SEQUENCE_LOW),
            range_end=self._keys.stored(prefix + _SEQUENCE_HIGH),
            limit=1,
            sort_order=rpc.RangeRequest.DESCEND,
            sort_target=rpc.RangeRequest.KEY,
        )

    def _last_of(self, kvs: Any) -> _Last:
        return (self._keys.key_of(kvs[0].key), kvs[0].mod_revision) if kvs else None

    async def append_sequence(self, prefix: str, value: bytes, deltas: tuple[int, ...]) -> Record:
        if self._closed:
            raise ClosedError("etcd metadata store is closed; open a new one")
        answer: asyncio.Future[Record] = asyncio.get_running_loop().create_future()
        queue = self._appends.setdefault(prefix, _AppendQueue())
        queue.waiting.append(_Append(value, deltas, answer))
        if queue.committer is None:
            queue.committer = asyncio.get_running_loop().create_task(
                self._commit_appends(prefix, queue), name="icefloe-etcd-append"
            )
        return await answer

    async def _commit_appends(self, prefix: str, queue: _AppendQueue) -> None:
        """Commit the sequence's waiting appends, a transaction's worth at a time."""
        try:
            while queue.waiting:
                batch = queue.waiting[:_APPEND_BATCH]
                del queue.waiting[:_APPEND_BATCH]
                try:
                    await self._append_batch(prefix, batch)
                except Exception as exc:  # noqa: BLE001 - handed to the waiting callers
                    for append in batch:
                        if not append.answer.done():
                            append.answer.set_exception(exc)
        finally:
            queue.committer = None
            if not queue.waiting:
                self._appends.pop(prefix, None)

    async def _append_batch(self, prefix: str, batch: list[_Append]) -> None:
        if prefix in self._last_keys:
            last = self._last_keys[prefix]
        else:
            response = await self._call(
                self._kv.Range, self._last_key_request(prefix), f"append to {prefix!r}"
            )
            last = self._last_of(response.kvs)
        while True:
            planned: list[tuple[_Append, str]] = []
            previous = last
            for append in batch:
                try:
                    key = self._next_key(prefix, previous, append.deltas)
                except ValueError as exc:  # this caller's deltas only: the others go on
                    append.answer.set_exception(exc)
                    continue
                planned.append((append, key))
                previous = (key, 0)
            batch = [append for append, _ in planned]
            if not planned:
                return
            puts = [
                rpc.RequestOp(
                    request_put=rpc.PutRequest(key=self._keys.stored(key), value=append.value)
                )
                for append, key in planned
            ]
            txn = rpc.TxnRequest(
                compare=self._unchanged(prefix, last),
                success=puts,
                failure=[rpc.RequestOp(request_range=self._last_key_request(prefix))],
            )
            response = await self._call(self._kv.Txn, txn, f"append to {prefix!r}")
            if response.succeeded:
                revision = response.header.revision
                self._remember(prefix, (planned[-1][1], revision))
                for append, key in planned:
                    if not append.answer.done():
                        append.answer.set_result(Record(key, append.value, revision))
                return
            # Someone else appended (or deleted the last key): start from what is there now.
            last = self._last_of(response.responses[0].response_range.kvs)
            self._remember(prefix, last)

    def _next_key(self, prefix: str, last: _Last, deltas: tuple[int, ...]) -> str:
        previous = (0,) * len(deltas)
        if last is not None:
            try:
                previous = sequence_components(prefix, last[0])
            except ValueError as exc:
                raise StorageError(
                    f"{last[0]!r} lies in sequence {prefix!r} but is not a sequence key"
                ) from exc
            if len(previous) != len(deltas):
                raise ValueError(
                    f"sequence {prefix!r} has {len(previous)} components, got {len(deltas)} deltas"
                )
        key = sequence_key(prefix, [p + d for p, d in zip(previous, deltas, strict=True)])
        validate_key(key)
        return key

    def _unchanged(self, prefix: str, last: _Last) -> list[Any]:
        """Conditions: ``last`` is still the sequence's highest key."""
        high = self._keys.stored(prefix + _SEQUENCE_HIGH)
        if last is None:
            after, conditions = self._keys.stored(prefix + _SEQUENCE_LOW), []
        else:
            stored = self._keys.stored(last[0])
            after, conditions = stored + b"\x00", [_compare(stored, last[1])]
        # Over a range, a comparison must hold for every key in it: "all have version 0"
        # holds exactly when the range is empty.
        conditions.append(
            rpc.Compare(
                key=after,
                range_end=high,
                result=rpc.Compare.EQUAL,
                target=rpc.Compare.VERSION,
                version=0,
            )
        )
        return conditions

    def _remember(self, prefix: str, last: _Last) -> None:
        self._last_keys[prefix] = last
        self._last_keys.move_to_end(prefix)
        if len(self._last_keys) > _SEQUENCE_CACHE:
            self._last_keys.popitem(last=False)

    # --- transactions -------------------------------------------------------------------------

    async def transact(self, checks: list[Check], writes: list[Put | Delete]) -> None:
        operations = [
            rpc.RequestOp(request_put=rpc.PutRequest(key=self._keys.stored(w.key), value=w.value))
            if isinstance(w, Put)
            else rpc.RequestOp(
                request_delete_range=rpc.DeleteRangeRequest(key=self._keys.stored(w.key))
            )
            for w in writes
        ]
        txn = rpc.TxnRequest(
            compare=[_compare(self._keys.stored(c.key), c.version) for c in checks],
            success=operations,
        )
        response = await self._call(self._kv.Txn, txn, "transaction")
        if not response.succeeded:
            raise ConflictError("a transaction check failed; nothing was written")

    def _operation(self, write: Put | Delete) -> Any:
        stored = self._keys.stored(write.key)
        if isinstance(write, Put):
            return rpc.RequestOp(request_put=rpc.PutRequest(key=stored, value=write.value))
        return rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=stored))

    # --- notifications and sessions -----------------------------------------------------------

    async def watch(self, prefix: str) -> Watch:
        if self._closed:
            raise ClosedError("etcd metadata store is closed; open a new one")
        watch = await EtcdWatch.open(
            self._connection, self._keys, prefix, self._options.watch_queue_size
        )
        if self._is_closed():  # close() ran while etcd was creating the watch
            await watch.close()
            raise ClosedError("etcd metadata store is closed; open a new one")
        self._watches.add(watch)
        return watch

    async def open_session(self, ttl: float) -> Session:
        if self._closed:
            raise ClosedError("etcd metadata store is closed; open a new one")
        session = await EtcdSession.open(self._connection, ttl)
        self._sessions.add(session)
        return session

    def _own(self, session: Session) -> EtcdSession:
        if not isinstance(session, EtcdSession) or session not in self._sessions:
            raise ValueError(f"session {session.id} was not opened by this metadata store")
        return session

    # --- lifecycle ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Revoke sessions (deleting their keys), end watches, close the channel; idempotent."""
        if self._closed:
            return
        self._closed = True
        for queue in list(self._appends.values()):
            if queue.committer is not None:
                queue.committer.cancel()
            for append in queue.waiting:
                if not append.answer.done():
                    append.answer.set_exception(ClosedError("etcd metadata store closed"))
        for session in list(self._sessions):
            await session.close()
        for watch in list(self._watches):
            await watch.close()
        self._watches.clear()
        await self._connection.close()
