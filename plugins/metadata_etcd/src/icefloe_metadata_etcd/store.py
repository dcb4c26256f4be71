"""The etcd metadata store (``[metadata] backend = "etcd"``).

This module is what the plugin registry loads: it holds the options model and imports neither
gRPC nor the etcd client. :meth:`EtcdMetadataStore.open` loads
:mod:`~icefloe_metadata_etcd.backend`, where the port's primitives become etcd requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import Check, Delete, MetadataStore, Put, Record, Session, Watch
from icefloe_metadata_etcd.options import EtcdMetadataOptions

if TYPE_CHECKING:
    from icefloe_metadata_etcd.backend import EtcdBackend


class EtcdMetadataStore(MetadataStore):
    """Metadata in an etcd v3 cluster, with multi-key transactions."""

    capabilities = frozenset({MetadataStore.MULTI_KEY_TRANSACTION})
    options_model = EtcdMetadataOptions

    def __init__(self, backend: EtcdBackend) -> None:
        """Use :meth:`open`."""
        self._backend = backend

    @classmethod
    async def open(cls, options: EtcdMetadataOptions, context: OpenContext) -> Self:
        """Connect to etcd (and log in when credentials are set).

        Raises:
            UnavailableError: no endpoint answered within ``request_timeout``.
        """
        # Imported here, not at the top: loading the class (to list or validate) loads no gRPC.
        from icefloe_metadata_etcd.backend import EtcdBackend

        return cls(await EtcdBackend.connect(options))

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

    async def _transact(self, checks: list[Check], writes: list[Put | Delete]) -> None:
        await self._backend.transact(checks, writes)

    async def _watch(self, prefix: str) -> Watch:
        return await self._backend.watch(prefix)

    async def _open_session(self, ttl: float) -> Session:
        return await self._backend.open_session(ttl)

    async def close(self) -> None:
        """Revoke sessions (deleting their keys), end watches, close the channel; idempotent."""
        await self._backend.close()
