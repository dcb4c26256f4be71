"""The ObjectStore port: immutable objects addressed by key.

Contract (executable form: ``icefloe.testing.object_store_contract``):

Keys
    Non-empty ``str`` of at most 1024 UTF-8 bytes: ``/``-separated segments, none of them empty,
    ``.`` or ``..``, and no control characters. Listing is in key order (UTF-8 bytes).

Writes
    ``put`` stores the whole object or nothing: a reader never sees a partial object, and a
    failed write leaves any previous object in place. With ``if_absent=True`` the write
    succeeds only if no object has the key, even under concurrent writers (exactly one wins);
    the losers get :class:`~icefloe.errors.AlreadyExistsError`. ``put_stream`` does the same for
    data that arrives in chunks (multipart or resumable upload), holding at most about one part
    in memory. If the chunk source raises, its exception propagates unchanged and no object
    is created.

Reads
    ``get(key, start, end)`` returns bytes ``[start, min(end, size))``; ``start >= size``
    returns ``b""``. ``get_view`` returns the same bytes as a ``memoryview``, which a store may
    fill for the call instead of copying (a writable view is the caller's to change); by
    default it views what ``get`` returns. ``get_stream`` yields an object in chunks. A
    missing key raises :class:`~icefloe.errors.NotFoundError`; ``head`` returns ``None``
    instead.

Deletes
    ``delete`` is idempotent: deleting a missing key is not an error.

Capabilities
    ``SHARED``: the objects live outside this process: another process opening the store with
    the same options sees them, and a stored object holds no memory here. Every real backend
    declares it; an in-memory store for tests does not.

Counters
    ``stats`` counts the requests the adapter really sent, by :class:`RequestKind`, and the
    payload bytes moved (uploaded for PUT, downloaded for GET), for the cost report. A
    multipart upload counts each request it makes; failed requests count too.
"""

from __future__ import annotations

import abc
import enum
import threading
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar, Final

from icefloe.errors import CapabilityError, NotFoundError
from icefloe.ports.base import Port, PortKind

MAX_KEY_BYTES: Final = 1024
DEFAULT_CHUNK_SIZE: Final = 8 << 20


class RequestKind(enum.StrEnum):
    PUT = "PUT"
    GET = "GET"
    HEAD = "HEAD"
    LIST = "LIST"
    DELETE = "DELETE"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What ``head`` and ``list`` report about an object."""

    key: str
    size: int
    modified: float
    """Last modification, seconds since the epoch."""
    etag: str | None = None


@dataclass
class RequestStats:
    """Thread-safe request and byte counters by kind."""

    requests: dict[RequestKind, int] = field(default_factory=lambda: dict.fromkeys(RequestKind, 0))
    bytes: dict[RequestKind, int] = field(default_factory=lambda: dict.fromkeys(RequestKind, 0))
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, kind: RequestKind, nbytes: int = 0, requests: int = 1) -> None:
        with self._lock:
            self.requests[kind] += requests
            self.bytes[kind] += nbytes

    def add(self, snapshot: dict[str, dict[str, int]]) -> None:
        """Add what another process counted (a :meth:`snapshot` of its stats)."""
        with self._lock:
            for kind in RequestKind:
                self.requests[kind] += snapshot["requests"].get(kind.value, 0)
                self.bytes[kind] += snapshot["bytes"].get(kind.value, 0)

    def snapshot(self) -> dict[str, dict[str, int]]:
        """A plain copy: ``{"requests": {"PUT": n, …}, "bytes": {…}}``."""
        with self._lock:
            return {
                "requests": {k.value: v for k, v in self.requests.items()},
                "bytes": {k.value: v for k, v in self.bytes.items()},
            }


def validate_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty str, got {key!r}")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"object key longer than {MAX_KEY_BYTES} bytes: {key[:40]!r}…")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in key):
        raise ValueError(f"object key contains a control character: {key!r}")
    if any(segment in ("", ".", "..") for segment in key.split("/")):
        raise ValueError(f"object key has an empty, '.' or '..' segment: {key!r}")


def validate_range(key: str, start: int, end: int | None) -> None:
    validate_key(key)
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"invalid byte range [{start}, {end})")


def validate_prefix(prefix: str) -> None:
    if not isinstance(prefix, str):
        raise ValueError(f"object prefix must be a str, got {prefix!r}")
    if prefix:
        # A prefix may end in "/" (a folder) or in part of a segment.
        validate_key(prefix.removesuffix("/") or "x")


class ObjectStore(Port):
    """Immutable objects by key; see the module docstring for the contract."""

    kind: ClassVar[PortKind] = PortKind.OBJECT_STORE
    SHARED: ClassVar[str] = "shared"
    billed_per_request: ClassVar[bool] = True
    """Whether each request costs money (cloud object stores); a store on local disk says
    ``False``, and Icefloe then flushes its WAL for latency rather than for cost."""

    def __init__(self) -> None:
        self.stats = RequestStats()

    async def put(
        self, key: str, data: bytes | bytearray | memoryview, *, if_absent: bool = False
    ) -> ObjectInfo:
        """Store ``data`` at ``key`` atomically.

        Raises:
            AlreadyExistsError: ``if_absent`` and the key exists.
        """
        validate_key(key)
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"object data must be bytes-like, got {type(data).__name__}")
        return await self._put(key, data, if_absent)

    async def put_stream(
        self,
        key: str,
        chunks: AsyncIterable[bytes | bytearray | memoryview],
        *,
        if_absent: bool = False,
    ) -> ObjectInfo:
        """Store an object that arrives in chunks (multipart/resumable upload), atomically."""
        validate_key(key)
        return await self._put_stream(key, chunks, if_absent)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to the end).

        Raises:
            NotFoundError: no object has the key.
        """
        validate_range(key, start, end)
        if end == start:
            return b""
        return await self._get(key, start, end)

    async def get_view(self, key: str, start: int = 0, end: int | None = None) -> memoryview:
        """:meth:`get` for a reader that passes the bytes on (into a fetch response) rather
        than keep them: a store may answer with a buffer it filled for this call instead of
        a ``bytes`` copy of it. A writable view is the caller's to change.

        Raises:
            NotFoundError: no object has the key.
        """
        validate_range(key, start, end)
        if end == start:
            return memoryview(b"")
        return await self._get_view(key, start, end)

    def get_stream(self, key: str, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> AsyncIterator[bytes]:
        """Yield the object in chunks of at most ``chunk_size`` bytes."""
        validate_key(key)
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        return self._get_stream(key, chunk_size)

    async def head(self, key: str) -> ObjectInfo | None:
        """Size and modification time of the object, or ``None`` if absent."""
        validate_key(key)
        return await self._head(key)

    async def delete(self, key: str) -> None:
        """Delete the object; deleting a missing key is not an error."""
        validate_key(key)
        await self._delete(key)

    def list(self, prefix: str = "") -> AsyncIterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order."""
        validate_prefix(prefix)
        return self._list(prefix)

    def url(self, key: str) -> str:
        """A URL table engines (pyiceberg, delta-rs, DuckDB, Spark) open the object by:
        ``file:///…``, ``s3://bucket/…``, ``gs://…``, ``az://…``. ``key`` may also be a folder
        prefix without a trailing slash."""
        validate_prefix(key)
        return self._url(key)

    def engine_options(self) -> dict[str, str]:
        """Settings an engine needs to reach :meth:`url` (endpoint, region, credentials), in
        the vocabulary of the Rust ``object_store`` crate (delta-rs, DuckDB's delta extension,
        Polars); empty when the URL says it all."""
        return {}

    def iceberg_properties(self) -> dict[str, str]:
        """The same settings as Iceberg FileIO properties (``s3.endpoint``, ``adls.account-name``,
        …: pyiceberg's names, which Iceberg's Java FileIOs share); empty when the URL says it
        all."""
        return {}

    # --- adapter primitives -------------------------------------------------------------------

    @abc.abstractmethod
    async def _put(
        self, key: str, data: bytes | bytearray | memoryview, if_absent: bool
    ) -> ObjectInfo: ...

    @abc.abstractmethod
    async def _put_stream(
        self, key: str, chunks: AsyncIterable[bytes | bytearray | memoryview], if_absent: bool
    ) -> ObjectInfo: ...

    async def _get_view(self, key: str, start: int, end: int | None) -> memoryview:
        return memoryview(await self._get(key, start, end))

    @abc.abstractmethod
    async def _get(self, key: str, start: int, end: int | None) -> bytes: ...

    async def _get_stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        """Default: consecutive ranged reads (adapters may stream one response instead)."""
        info = await self.head(key)
        if info is None:
            raise NotFoundError(f"object {key!r} does not exist")
        for offset in range(0, info.size, chunk_size):
            yield await self._get(key, offset, min(offset + chunk_size, info.size))

    @abc.abstractmethod
    async def _head(self, key: str) -> ObjectInfo | None: ...

    @abc.abstractmethod
    async def _delete(self, key: str) -> None: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]: ...

    def _url(self, key: str) -> str:
        raise CapabilityError(
            f"{type(self).__name__} cannot give table engines a URL for its objects yet; "
            "run without table formats on it: [table] formats = [] (ICEFLOE_TABLE__FORMATS=[])"
        )
