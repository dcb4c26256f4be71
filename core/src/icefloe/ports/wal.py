"""The WAL port: durable storage for sealed write-ahead-log objects.

Contract (executable form: ``icefloe.testing.wal_contract``):

- ``append(data)`` returns only once ``data`` is durable, with an opaque reference (a ``str``
  of at most 512 bytes) that the caller stores in the offset index. Two appends never return
  the same reference. A failed append may leave an unreferenced object behind (an orphan); it
  never makes a reference readable with other bytes.
- ``read(ref, start, end)`` returns bytes ``[start, min(end, size))`` of what was appended,
  as ``bytes`` or as a ``memoryview`` of a buffer filled for the call (a writable one is the
  caller's to change); an unknown or deleted reference raises
  :class:`~icefloe.errors.NotFoundError`.
- ``delete(ref)`` is idempotent.
- ``list()`` enumerates every stored object with its size and creation time, for garbage
  collection of orphans and released objects; an object's creation time never lies in its
  future.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final

from icefloe.ports.base import Port, PortKind

MAX_REF_BYTES: Final = 512


@dataclass(frozen=True, slots=True)
class WalObjectInfo:
    ref: str
    size: int
    created: float
    """Creation time, seconds since the epoch."""


def validate_ref(ref: str) -> None:
    if not isinstance(ref, str) or not ref or len(ref.encode()) > MAX_REF_BYTES:
        raise ValueError(f"WAL reference must be a non-empty str of ≤ {MAX_REF_BYTES} bytes")


class WAL(Port):
    """Sealed WAL objects; see the module docstring for the contract."""

    kind: ClassVar[PortKind] = PortKind.WAL

    @property
    def billed_per_append(self) -> bool:
        """Whether every append is a request someone pays for (an object store in the cloud):
        the storage engine then batches appends more (``[storage] profile``, ``cost``)."""
        return True

    @property
    def reads_from_page_cache(self) -> bool:
        """Whether the objects are files on this host, whose recent ones reads find in the
        kernel's page cache: the storage engine then keeps no copy of them in memory."""
        return False

    async def append(self, data: bytes | bytearray | memoryview) -> str:
        """Store ``data`` durably and return its reference."""
        if not isinstance(data, bytes | bytearray | memoryview) or len(data) == 0:
            raise ValueError("a WAL object must be non-empty bytes")
        return await self._append(data)

    async def append_parts(self, parts: Sequence[bytes | memoryview]) -> str:
        """Store the bytes of ``parts``, one after another, as one object, durably; return its
        reference. A backend that can write them without joining them first overrides
        :meth:`_append_parts`."""
        views = [memoryview(part).cast("B") for part in parts]
        if not views or not any(views):
            raise ValueError("a WAL object must be non-empty bytes")
        return await self._append_parts(views)

    async def _append_parts(self, parts: list[memoryview]) -> str:
        return await self._append(b"".join(parts))

    async def read(self, ref: str, start: int = 0, end: int | None = None) -> bytes | memoryview:
        """Bytes ``[start, end)`` of the object ``ref`` (see the module docstring)."""
        validate_ref(ref)
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"invalid byte range [{start}, {end})")
        if end == start:
            return b""
        return await self._read(ref, start, end)

    async def delete(self, ref: str) -> None:
        """Delete the object ``ref``; deleting a missing one is not an error."""
        validate_ref(ref)
        await self._delete(ref)

    def list(self) -> AsyncIterator[WalObjectInfo]:
        """Every stored WAL object, oldest first where the backend can tell."""
        return self._list()

    @abc.abstractmethod
    async def _append(self, data: bytes | bytearray | memoryview) -> str: ...

    @abc.abstractmethod
    async def _read(self, ref: str, start: int, end: int | None) -> bytes | memoryview: ...

    @abc.abstractmethod
    async def _delete(self, ref: str) -> None: ...

    @abc.abstractmethod
    def _list(self) -> AsyncIterator[WalObjectInfo]: ...
