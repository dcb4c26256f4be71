"""The Oxia metadata store (``[metadata] backend = "oxia"``).

This module is what the plugin registry loads: it holds the options model and imports neither
gRPC nor protobuf. :meth:`OxiaMetadataStore.open` loads :mod:`~icefloe_metadata_oxia.backend`,
where the port's primitives become Oxia requests; the module docstrings of ``keys``,
``backend``, ``watch`` and ``session`` explain how byte order, sequences, versions,
notifications and sessions map onto Oxia.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import MetadataStore, Record, Session, Watch
from icefloe_metadata_oxia.options import OxiaMetadataOptions

if TYPE_CHECKING:
    from icefloe_metadata_oxia.backend import OxiaBackend


class OxiaMetadataStore(MetadataStore):
    """Metadata in an Oxia cluster. No multi-key transactions: Oxia has none."""

    options_model = OxiaMetadataOptions

    def __init__(self, backend: OxiaBackend) -> None:
        """Use :meth:`open`."""
        self._backend = backend

    @classmethod
    async def open(cls, options: OxiaMetadataOptions, context: OpenContext) -> Self:
        """Connect to Oxia and learn its shards.

        Raises:
            UnavailableError: no server answered within ``connect_timeout``.
        """
        # Imported here, not at the top: loading the class (to list or validate) loads no gRPC.
        from icefloe_metadata_oxia.backend import OxiaBackend

        return cls(await OxiaBackend.connect(options))

    async def _get(self, key: str) -> Record | None:
        return await self._backend.get(key)

    async def _put(
        self, key: str, value: bytes, expected_version: int | None, session: Session | None
    ) -> Record:
        return await self._backend.put(key, value, expected_version, session)

    async def _delete(self, key: str, expected_version: int | None) -> bool:
        return await self._backend.delete(key, expected_version)

    async def _delete_range(self, start: str, end: str) -> None:
        await self._backend.delete_range(start, end)

    async def _scan(self, start: str, end: str, limit: int | None) -> list[Record]:
        return await self._backend.scan(start, end, limit)

    async def _floor(self, key: str) -> Record | None:
        return await self._backend.floor(key)

    async def _ceiling(self, key: str) -> Record | None:
        return await self._backend.ceiling(key)

    async def _append_sequence(self, prefix: str, value: bytes, deltas: tuple[int, ...]) -> Record:
        return await self._backend.append_sequence(prefix, value, deltas)

    async def _watch(self, prefix: str) -> Watch:
        return await self._backend.watch(prefix)

    async def _open_session(self, ttl: float) -> Session:
        return await self._backend.open_session(ttl)

    async def close(self) -> None:
        """Close sessions (deleting their keys), end watches, close the channels; idempotent."""
        await self._backend.close()
