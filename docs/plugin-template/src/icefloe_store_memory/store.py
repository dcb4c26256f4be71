"""The adapter. A real backend imports its SDK inside ``open()``, not at module level."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Self

from icefloe.errors import AlreadyExistsError, NotFoundError, StorageError
from icefloe.ports.base import BackendOptions, OpenContext
from icefloe.ports.object_store import ObjectInfo, ObjectStore, RequestKind


class MemoryObjectStoreOptions(BackendOptions):
    """Options from ``[object_store.memory]``; unknown keys are rejected by the base model."""

    max_bytes: int = 1 << 30


class MemoryObjectStore(ObjectStore):
    options_model = MemoryObjectStoreOptions

    def __init__(self, options: MemoryObjectStoreOptions) -> None:
        super().__init__()
        self._options = options
        self._objects: dict[str, tuple[bytes | bytearray, float]] = {}
        self._size = 0
        self._lock = asyncio.Lock()

    @classmethod
    async def open(cls, options: MemoryObjectStoreOptions, context: OpenContext) -> Self:
        return cls(options)

    async def _put(
        self, key: str, data: bytes | bytearray | memoryview, if_absent: bool
    ) -> ObjectInfo:
        return await self._store(key, bytes(data), if_absent)

    async def _put_stream(
        self, key: str, chunks: AsyncIterable[bytes | bytearray | memoryview], if_absent: bool
    ) -> ObjectInfo:
        buffer = bytearray()
        async for chunk in chunks:
            buffer += chunk
        # Stored as the bytearray itself: converting to bytes would hold the object twice.
        return await self._store(key, buffer, if_absent)

    async def _store(self, key: str, data: bytes | bytearray, if_absent: bool) -> ObjectInfo:
        async with self._lock:
            if if_absent and key in self._objects:
                raise AlreadyExistsError(f"object {key!r} already exists")
            replaced = len(self._objects[key][0]) if key in self._objects else 0
            if self._size - replaced + len(data) > self._options.max_bytes:
                raise StorageError(
                    f"memory object store is full; raise [object_store.memory] max_bytes "
                    f"(now {self._options.max_bytes})"
                )
            self._size += len(data) - replaced
            self._objects[key] = (data, time.time())
            self.stats.record(RequestKind.PUT, len(data))
            return ObjectInfo(key, len(data), self._objects[key][1])

    async def _get(self, key: str, start: int, end: int | None) -> bytes:
        entry = self._objects.get(key)
        if entry is None:
            self.stats.record(RequestKind.GET)
            raise NotFoundError(f"object {key!r} does not exist")
        chunk = bytes(entry[0][start:end])
        self.stats.record(RequestKind.GET, len(chunk))
        return chunk

    async def _head(self, key: str) -> ObjectInfo | None:
        self.stats.record(RequestKind.HEAD)
        entry = self._objects.get(key)
        return None if entry is None else ObjectInfo(key, len(entry[0]), entry[1])

    async def _delete(self, key: str) -> None:
        self.stats.record(RequestKind.DELETE)
        entry = self._objects.pop(key, None)
        if entry is not None:
            self._size -= len(entry[0])

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        self.stats.record(RequestKind.LIST)
        for key in sorted(k for k in self._objects if k.startswith(prefix)):
            data, modified = self._objects[key]
            yield ObjectInfo(key, len(data), modified)
