"""The object-store WAL: one object per sealed WAL object, in any :class:`ObjectStore`.

An append stores its bytes under ``<prefix>/<ref>`` with ``ref = <ms>-<uuid>``: the creation
time in milliseconds since the epoch, zero-padded to 13 digits so that key order is time
order, then a random uuid4 so that two appends never share a key. The write is
create-if-absent, so even a repeated ref could never replace bytes already referenced.

The reference is the key without the prefix: short (it is stored in every offset-index entry
that points at the object), and readable by every broker configured with the same prefix.
Changing ``prefix`` therefore hides the objects written under the old one.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Final, Self

from pydantic import field_validator

from icefloe.errors import ClosedError, ConfigError, NotFoundError
from icefloe.ports.base import BackendOptions, OpenContext
from icefloe.ports.object_store import ObjectStore, validate_key
from icefloe.ports.wal import WAL, WalObjectInfo

_TIMED_REF: Final = re.compile(r"(\d{13})-[0-9a-f]{32}")
_SAMPLE_REF: Final = f"{0:013d}-{uuid.UUID(int=0).hex}"


class ObjectWALOptions(BackendOptions):
    """Options of ``[wal] backend = "object"``."""

    prefix: str = "wal"
    """Key prefix (a folder) of the WAL objects in the object store."""

    @field_validator("prefix")
    @classmethod
    def _prefix_forms_keys(cls, prefix: str) -> str:
        validate_key(f"{prefix}/{_SAMPLE_REF}")  # ValueError names the problem
        return prefix


class ObjectWAL(WAL):
    """WAL objects stored in the configured object store; see the module docstring."""

    options_model = ObjectWALOptions

    def __init__(self, store: ObjectStore, prefix: str = "wal") -> None:
        """Keep WAL objects under ``prefix`` in ``store``, which the caller owns and closes."""
        self._store = store
        self._folder = f"{prefix}/"
        self._closed = False

    @classmethod
    async def open(cls, options: ObjectWALOptions, context: OpenContext) -> Self:
        """Use the object store of ``context``.

        Raises:
            ConfigError: no object store was configured.
        """
        if context.object_store is None:
            raise ConfigError(
                '[wal] backend = "object" keeps the WAL in the object store, but none was '
                'opened: configure [object_store] (e.g. backend = "local") or choose another '
                "WAL backend"
            )
        return cls(context.object_store, options.prefix)

    async def close(self) -> None:
        """Refuse further calls; the object store stays open (it belongs to the caller)."""
        self._closed = True

    @property
    def billed_per_append(self) -> bool:
        return self._store.billed_per_request

    async def _append(self, data: bytes | bytearray | memoryview) -> str:
        self._check_open()
        # Taken before the write, so the time in the ref never lies in the object's future.
        ref = f"{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex}"
        await self._store.put(self._folder + ref, data, if_absent=True)
        return ref

    async def _read(self, ref: str, start: int, end: int | None) -> memoryview:
        self._check_open()
        try:
            # A view: readers pass WAL bytes on into fetch responses, and a store that reads
            # into a buffer of its own then spares a copy.
            return await self._store.get_view(self._key_of(ref), start, end)
        except NotFoundError as exc:
            raise NotFoundError(f"WAL object {ref!r} does not exist") from exc

    async def _delete(self, ref: str) -> None:
        self._check_open()
        try:
            key = self._key_of(ref)
        except NotFoundError:
            return  # never a key of this WAL, so nothing to delete
        await self._store.delete(key)

    async def _list(self) -> AsyncIterator[WalObjectInfo]:
        self._check_open()
        async for info in self._store.list(self._folder):
            ref = info.key.removeprefix(self._folder)
            yield WalObjectInfo(ref, info.size, _created(ref, info.modified))

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the object WAL is closed")

    def _key_of(self, ref: str) -> str:
        key = self._folder + ref
        try:
            validate_key(key)
        except ValueError as exc:
            raise NotFoundError(f"{ref!r} is not a reference of this WAL") from exc
        return key


def _created(ref: str, modified: float) -> float:
    """Creation time of the object ``ref``: the earlier of its ref's time and its mtime.

    The store's modification time bounds a writer whose clock ran ahead; objects that someone
    else put under the prefix have no time in their name and fall back to it alone.
    """
    timed = _TIMED_REF.fullmatch(ref)
    if timed is None:
        return modified
    return min(int(timed[1]) / 1000, modified)
