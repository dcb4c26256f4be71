"""The BookKeeper WAL: one ledger per sealed WAL object.

An append creates a ledger (ensemble, write and ack quorum from the options), writes the object
as entries of ``entry_size`` bytes, and returns once the ack quorum of bookies holds every
entry: ``bk1:<ledger id>:<size>:<entry size>`` (:mod:`icefloe_wal_bookkeeper.refs`). The
ledger is then closed in the background: closing records its length in the metadata service
but adds no durability, and a reader never needs it, because the reference says which entries
to read (``readUnconfirmed``). A ledger left open by a crash reads the same.

Every ledger carries custom metadata: the namespace, the object's size and entry size and the
time of the append. A reader checks them against the reference before reading, so a reference
to a ledger of another namespace, another system or with another size is not found, and
``delete`` never touches a ledger that is not this namespace's. ``list`` walks the cluster's
ledgers and keeps this namespace's, for garbage collection.

One ledger per object, rather than objects as entry ranges of a rolling ledger, because the
port deletes objects one by one: a ledger is BookKeeper's unit of deletion, and a rolling
ledger could only go once every object in it is released, which needs a reference count kept
somewhere durable. The price is a ledger creation per append (a metadata write): see the
README for the measurements behind the choice.

The Java client runs in this process's JVM (:mod:`icefloe_wal_bookkeeper.jvm`); its calls are
asynchronous and awaited through completion callbacks, never blocking the event loop. The few
blocking calls (building the client, walking the ledger list) run on a small thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final, Self, TypeVar

import jpype  # type: ignore[import-untyped]  # importing it starts no JVM

from icefloe.adapters import BlockingSdk
from icefloe.errors import (
    ClosedError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.base import OpenContext
from icefloe.ports.wal import WAL, WalObjectInfo
from icefloe_wal_bookkeeper import jvm
from icefloe_wal_bookkeeper.options import BookKeeperWALOptions
from icefloe_wal_bookkeeper.refs import MAX_OBJECT_SIZE, PREFIX, LedgerRef, parse

log = logging.getLogger(__name__)

T = TypeVar("T")

MARK: Final = "icefloe-wal"
NAMESPACE: Final = "icefloe-namespace"
SIZE: Final = "icefloe-size"
ENTRY_SIZE: Final = "icefloe-entry-size"
CREATED_MS: Final = "icefloe-created-ms"

LIST_BATCH: Final = 256
"""Ledger ids taken from the listing, and metadata read concurrently, per step of ``list``."""
MAX_PENDING_CLOSES: Final = 256
"""Ledgers closing in the background; past this an append waits for its own close."""

_NOT_FOUND_CODES: Final = (
    "NoSuchLedgerExistsException",
    "NoSuchLedgerExistsOnMetadataServerException",
    "NoSuchEntryException",
)


class _ByteBudget:
    """At most ``limit`` bytes of appends in flight; an object larger than the limit goes
    alone. Waiters are served in order (no starvation of large objects)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def reserve(self, size: int) -> AsyncIterator[None]:
        size = min(size, self._limit)
        async with self._changed:
            await self._changed.wait_for(lambda: self._used + size <= self._limit)
            self._used += size
        try:
            yield
        finally:
            async with self._changed:
                self._used -= size
                self._changed.notify_all()


class BookKeeperWAL(WAL):
    """WAL objects as BookKeeper ledgers; see the module docstring."""

    options_model = BookKeeperWALOptions

    def __init__(self, options: BookKeeperWALOptions, client: Any, sdk: BlockingSdk) -> None:
        self._options = options
        self._client = client
        self._sdk = sdk
        self._bytes = jpype.JArray(jpype.JByte)
        self._future = jpype.JClass("java.util.concurrent.CompletableFuture")
        self._hash_map = jpype.JClass("java.util.HashMap")
        self._password = self._bytes(options.password.get_secret_value().encode())
        digest_types = jpype.JClass("org.apache.bookkeeper.client.api.DigestType")
        self._digest = digest_types.valueOf(options.digest_type.upper())
        codes = jpype.JClass("org.apache.bookkeeper.client.api.BKException$Code")
        self._not_found = {int(getattr(codes, name)) for name in _NOT_FOUND_CODES}
        self._unauthorized = int(codes.UnauthorizedAccessException)
        self._digest_mismatch = int(codes.DigestMatchException)
        self._bk_exception = jpype.JClass("org.apache.bookkeeper.client.api.BKException")
        self._budget = _ByteBudget(options.max_inflight_bytes)
        self._closing: set[asyncio.Future[Any]] = set()
        self._closing_writes: dict[int, asyncio.Future[Any]] = {}
        """Background closes of ledgers this WAL wrote, by ledger id: a delete waits for its
        ledger's close, which would otherwise fail on the deleted metadata (and say so)."""
        self._closed = False

    # --- life cycle -------------------------------------------------------------------------

    @classmethod
    async def open(cls, options: BookKeeperWALOptions, context: OpenContext) -> Self:
        """Start the JVM if this process has none yet, and connect a ledger client.

        Raises:
            ConfigError: no BookKeeper client jars in ``classpath``, or no Java runtime.
            UnavailableError: the metadata service (ZooKeeper) cannot be reached.
        """
        sdk = BlockingSdk(
            f"the BookKeeper WAL on {options.metadata_service_uri}",
            threads=2,
            thread_name_prefix="icefloe-bookkeeper",
        )
        try:
            await sdk.run(
                jvm.ensure_jvm,
                options.classpath,
                options.jvm_max_heap_mb,
                options.jvm_max_direct_mb,
            )
            client = await asyncio.wait_for(
                sdk.run(_build_client, options), options.zk_session_timeout + 5
            )
        except IcefloeError:
            await sdk.close()
            raise
        except Exception as exc:
            await sdk.close()
            raise UnavailableError(
                f"cannot connect to BookKeeper at [wal.bookkeeper] metadata_service_uri = "
                f"{options.metadata_service_uri!r}: {_describe(exc)}"
            ) from exc
        return cls(options, client, sdk)

    async def close(self) -> None:
        """Wait for the ledgers still closing, then release the client; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=self._options.request_timeout)
        await self._sdk.run(self._client.close)
        await self._sdk.close()

    @property
    def billed_per_append(self) -> bool:
        return False

    # --- the port ---------------------------------------------------------------------------

    async def _append(self, data: bytes | bytearray | memoryview) -> str:
        self._check_open()
        view = memoryview(data).cast("B")
        size = view.nbytes
        if size > MAX_OBJECT_SIZE:
            raise ValueError(f"a WAL object may hold at most {MAX_OBJECT_SIZE} bytes, not {size}")
        entry_size = self._options.entry_size
        async with self._budget.reserve(size):
            created_ms = time.time_ns() // 1_000_000  # before the ledger exists: never later
            handle = await self._java(
                "create a ledger", self._create_op(size, entry_size, created_ms).execute()
            )
            try:
                appends = [
                    handle.appendAsync(self._bytes(view[offset : offset + entry_size]))
                    for offset in range(0, size, entry_size)
                ]
                await self._java(
                    f"append to ledger {handle.getId()}",
                    self._future.allOf(self._java_array(appends)),
                )
            except BaseException:
                # An orphan: never referenced, deleted by garbage collection.
                self._close_in_background(handle)
                raise
            ref = LedgerRef(int(handle.getId()), size, entry_size)
            if len(self._closing) >= MAX_PENDING_CLOSES:
                await self._close_ledger(handle)
            else:
                self._close_in_background(handle, written=True)
        return str(ref)

    async def _read(self, ref: str, start: int, end: int | None) -> bytes:
        self._check_open()
        location = parse(ref)
        handle = await self._open_ledger(location, ref)
        try:
            end = location.size if end is None else min(end, location.size)
            if start >= end:
                return b""
            first, last = location.entry_range(start, end)
            parts = await self._java(
                f"read ledger {location.ledger_id}",
                handle.readUnconfirmedAsync(first, last),
                convert=lambda entries: _copy_entries(entries, location, first),
                ref=ref,
            )
        finally:
            self._close_in_background(handle)
        data = b"".join(parts)
        offset = first * location.entry_size
        return data[start - offset : end - offset]

    async def _delete(self, ref: str) -> None:
        self._check_open()
        try:
            location = parse(ref)
            await self._check_ours(location, ref)
        except NotFoundError:
            return  # never a ledger of this WAL, or already gone
        closing = self._closing_writes.get(location.ledger_id)
        if closing is not None:
            await asyncio.wait([closing], timeout=self._options.request_timeout)
        try:
            await self._java(
                f"delete ledger {location.ledger_id}",
                self._client.newDeleteLedgerOp().withLedgerId(location.ledger_id).execute(),
                ref=ref,
            )
        except NotFoundError:
            return

    async def _list(self) -> AsyncIterator[WalObjectInfo]:
        self._check_open()
        listing = await self._java("list ledgers", self._client.newListLedgersOp().execute())
        try:
            ids = listing.iterator()
            while True:
                batch = await self._blocking("list ledgers", _take, ids, LIST_BATCH)
                if not batch:
                    return
                infos = await asyncio.gather(*(self._info(ledger_id) for ledger_id in batch))
                for info in infos:
                    if info is not None:
                        yield info
        finally:
            listing.close()

    # --- ledgers ----------------------------------------------------------------------------

    def _create_op(self, size: int, entry_size: int, created_ms: int) -> Any:
        metadata = self._hash_map()
        for key, value in (
            (MARK, PREFIX),
            (NAMESPACE, self._options.namespace),
            (SIZE, str(size)),
            (ENTRY_SIZE, str(entry_size)),
            (CREATED_MS, str(created_ms)),
        ):
            metadata.put(key, self._bytes(value.encode()))
        return (
            self._client.newCreateLedgerOp()
            .withEnsembleSize(self._options.ensemble)
            .withWriteQuorumSize(self._options.write_quorum)
            .withAckQuorumSize(self._options.ack_quorum)
            .withDigestType(self._digest)
            .withPassword(self._password)
            .withCustomMetadata(metadata)
        )

    async def _open_ledger(self, location: LedgerRef, ref: str) -> Any:
        """A read handle on the ledger of ``ref``, after checking it is this WAL's."""
        handle = await self._java(
            f"open ledger {location.ledger_id}",
            self._client.newOpenLedgerOp()
            .withLedgerId(location.ledger_id)
            .withRecovery(False)
            .withDigestType(self._digest)
            .withPassword(self._password)
            .execute(),
            ref=ref,
        )
        try:
            self._check_metadata(handle.getLedgerMetadata(), location, ref)
        except BaseException:
            self._close_in_background(handle)
            raise
        return handle

    async def _check_ours(self, location: LedgerRef, ref: str) -> None:
        metadata = await self._java(
            f"read the metadata of ledger {location.ledger_id}",
            self._client.getLedgerMetadata(location.ledger_id),
            ref=ref,
        )
        self._check_metadata(metadata, location, ref)

    def _check_metadata(self, metadata: Any, location: LedgerRef, ref: str) -> None:
        facts = _custom(metadata)
        expected = {
            MARK: PREFIX,
            NAMESPACE: self._options.namespace,
            SIZE: str(location.size),
            ENTRY_SIZE: str(location.entry_size),
        }
        if any(facts.get(key) != value for key, value in expected.items()):
            raise NotFoundError(
                f"WAL object {ref!r} does not exist in namespace {self._options.namespace!r}"
            )

    async def _info(self, ledger_id: int) -> WalObjectInfo | None:
        """The WAL object in ledger ``ledger_id``, or ``None`` if it is not this namespace's
        (or was deleted since it was listed)."""
        try:
            metadata = await self._java(
                f"read the metadata of ledger {ledger_id}",
                self._client.getLedgerMetadata(ledger_id),
            )
        except NotFoundError:
            return None
        facts = _custom(metadata)
        if facts.get(MARK) != PREFIX or facts.get(NAMESPACE) != self._options.namespace:
            return None
        try:
            location = LedgerRef(ledger_id, int(facts[SIZE]), int(facts[ENTRY_SIZE]))
            created = int(facts[CREATED_MS]) / 1000
        except (KeyError, ValueError):
            log.warning("ledger %d has malformed Icefloe metadata; left alone", ledger_id)
            return None
        ctime = int(metadata.getCtime())
        if ctime > 0:
            created = min(created, ctime / 1000)
        return WalObjectInfo(str(location), location.size, created)

    def _close_in_background(self, handle: Any, *, written: bool = False) -> None:
        task = asyncio.ensure_future(self._close_ledger(handle))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        if written:
            ledger_id = int(handle.getId())
            self._closing_writes[ledger_id] = task
            task.add_done_callback(lambda _: self._closing_writes.pop(ledger_id, None))

    async def _close_ledger(self, handle: Any) -> None:
        try:
            await self._java(f"close ledger {handle.getId()}", handle.closeAsync())
        except IcefloeError as exc:
            # Nothing is lost: a ledger left open reads the same, and GC deletes orphans.
            log.debug("closing ledger %s failed: %s", handle.getId(), exc)

    # --- calls into Java --------------------------------------------------------------------

    async def _java(
        self,
        what: str,
        future: Any,
        *,
        convert: Callable[[Any], T] | None = None,
        ref: str | None = None,
    ) -> Any:
        """Await a Java future within ``request_timeout``, its failure as an Icefloe error."""
        try:
            return await asyncio.wait_for(
                jvm.await_java(future, convert), self._options.request_timeout
            )
        except TimeoutError as exc:
            future.cancel(True)
            raise UnavailableError(
                f"BookKeeper did not {what} within [wal.bookkeeper] request_timeout = "
                f"{self._options.request_timeout} s (metadata service "
                f"{self._options.metadata_service_uri}, {self._bookies_hint()})"
            ) from exc
        except jvm.JavaFailure as exc:
            raise self._translate(exc.cause, what, ref) from exc

    async def _blocking(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.wait_for(self._sdk.run(fn, *args), self._options.request_timeout)
        except TimeoutError as exc:
            raise UnavailableError(
                f"BookKeeper did not {what} within [wal.bookkeeper] request_timeout = "
                f"{self._options.request_timeout} s"
            ) from exc
        except IcefloeError:
            raise
        except Exception as exc:
            raise self._translate(jvm.unwrap(exc), what, None) from exc

    def _translate(self, error: Any, what: str, ref: str | None) -> IcefloeError:
        subject = f"WAL object {ref!r}" if ref is not None else "BookKeeper"
        if isinstance(error, self._bk_exception):
            code = int(error.getCode())
            if code in self._not_found:
                return NotFoundError(f"{subject} does not exist ({what}: {_describe(error)})")
            if code == self._unauthorized:
                return StorageError(
                    f"cannot {what}: the ledger's password is not [wal.bookkeeper] password "
                    "(every broker must use the same one)"
                )
            if code == self._digest_mismatch:
                return StorageError(
                    f"cannot {what}: an entry failed its checksum ({_describe(error)}); "
                    "check that every broker uses the same [wal.bookkeeper] digest_type"
                )
        return UnavailableError(f"cannot {what}: {_describe(error)} ({self._bookies_hint()})")

    def _bookies_hint(self) -> str:
        return (
            f"ensemble {self._options.ensemble}, write quorum {self._options.write_quorum}, "
            f"ack quorum {self._options.ack_quorum}"
        )

    def _java_array(self, futures: list[Any]) -> Any:
        return jpype.JArray(self._future)(futures)

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the BookKeeper WAL is closed")


def _build_client(options: BookKeeperWALOptions) -> Any:
    """A connected ``org.apache.bookkeeper.client.api.BookKeeper`` (blocking)."""
    conf = jpype.JClass("org.apache.bookkeeper.conf.ClientConfiguration")()
    conf.setMetadataServiceUri(options.metadata_service_uri)
    conf.setZkTimeout(int(options.zk_session_timeout * 1000))
    timeout_s = max(1, int(options.request_timeout))
    conf.setAddEntryTimeout(timeout_s)
    conf.setReadEntryTimeout(timeout_s)
    conf.setThrottleValue(0)  # back-pressure is the WAL's own byte budget
    conf.setStoreSystemtimeAsLedgerCreationTime(True)
    conf.setEnableDigestTypeAutodetection(True)
    return jpype.JClass("org.apache.bookkeeper.client.api.BookKeeper").newBuilder(conf).build()


def _take(iterator: Any, count: int) -> list[int]:
    """Up to ``count`` ledger ids from a ``LedgersIterator`` (blocking: it reads ZooKeeper)."""
    ids: list[int] = []
    while len(ids) < count and iterator.hasNext():
        ids.append(int(iterator.next()))
    return ids


def _custom(metadata: Any) -> dict[str, str]:
    """A ledger's custom metadata as text (values that are not UTF-8 are skipped)."""
    facts: dict[str, str] = {}
    for entry in metadata.getCustomMetadata().entrySet():
        with contextlib.suppress(UnicodeDecodeError):
            facts[str(entry.getKey())] = bytes(memoryview(entry.getValue())).decode()
    return facts


def _copy_entries(entries: Any, location: LedgerRef, first: int) -> list[bytes]:
    """The entries' bytes, checked against the reference's layout; the Java buffers are
    released whatever happens (runs on the client's thread)."""
    try:
        parts: list[bytes] = []
        entry_id = first
        for entry in entries:
            data = bytes(memoryview(entry.getEntryBytes()))
            if len(data) != location.entry_length(entry_id):
                raise StorageError(
                    f"entry {entry_id} of ledger {location.ledger_id} holds {len(data)} bytes, "
                    f"not the {location.entry_length(entry_id)} of {location}"
                )
            parts.append(data)
            entry_id += 1
        return parts
    finally:
        entries.close()


def _describe(error: Any) -> str:
    """A Java or Python exception as one line."""
    name = error.getClass().getSimpleName() if hasattr(error, "getClass") else type(error).__name__
    message = str(error.getMessage() if hasattr(error, "getMessage") else error) or ""
    return f"{name}: {message.splitlines()[0] if message else ''}".rstrip(": ")
