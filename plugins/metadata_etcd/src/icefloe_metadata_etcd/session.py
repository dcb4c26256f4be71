"""Port sessions on etcd leases, kept alive on a LeaseKeepAlive stream.

etcd lease TTLs are whole seconds with a server minimum (about 2 s with default election
settings): the lease is granted for ``ceil(ttl)`` and etcd may raise it. The session reports
itself lost when etcd answers a keep-alive with TTL 0 (the lease is gone), or once the granted
TTL has passed since the last keep-alive etcd answered was *sent*: etcd may have expired it by
then. A keep-alive that etcd does not answer (a paused or restarting server) is given up at
that moment, not after the connection's timeout, so the loss is reported on time. A keep-alive
stream that ended (etcd went away between two keep-alives) is replaced by a new one; and if
the keep-alives stop for any other reason, the session is reported lost, never left to run
out unnoticed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

import grpc  # type: ignore[import-untyped]  # grpc ships no type information
from aetcd import rpc  # type: ignore[import-untyped]

from icefloe.errors import StorageError
from icefloe.ports.metadata import Session
from icefloe_metadata_etcd.connection import EtcdConnection

_log = logging.getLogger(__name__)


class EtcdSession(Session):
    """An etcd lease; ``ttl`` is what etcd granted."""

    def __init__(
        self, connection: EtcdConnection, lease_id: int, ttl: float, granted_at: float
    ) -> None:
        """Use :meth:`open`; ``granted_at`` is when the grant was asked for."""
        self.lease_id = lease_id
        self.id = f"{lease_id:x}"
        self.ttl = ttl
        self._connection = connection
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # etcd counts the ttl from when it granted the lease, after it was asked for.
        self.renewed_at = granted_at
        self._keep_alive = asyncio.get_running_loop().create_task(
            self._keep_alive_forever(), name=f"icefloe-etcd-lease-{self.id}"
        )

    @classmethod
    async def open(cls, connection: EtcdConnection, ttl: float) -> EtcdSession:
        asked = time.monotonic()
        response = await connection.call(
            connection.leases.LeaseGrant,
            rpc.LeaseGrantRequest(TTL=math.ceil(ttl)),
            "grant lease",
        )
        return cls(connection, response.ID, float(response.TTL), asked)

    @property
    def lost(self) -> asyncio.Future[None]:
        return self._lost

    def expire(self) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        self._keep_alive.cancel()

    async def _keep_alive_forever(self) -> None:
        stream: Any = None
        sent = self.renewed_at
        try:
            while self.alive:
                await asyncio.sleep(self.until_keep_alive(sent))
                if self.remaining() <= 0:
                    _log.warning(
                        "etcd lease %s: no renewal for its ttl; reporting it lost", self.id
                    )
                    self.expire()
                    return
                sent = time.monotonic()
                try:
                    if stream is None:
                        stream = self._connection.leases.LeaseKeepAlive(
                            metadata=self._connection.metadata
                        )
                    async with asyncio.timeout(min(self._connection.timeout, self.remaining())):
                        await stream.write(rpc.LeaseKeepAliveRequest(ID=self.lease_id))
                        response = await stream.read()
                except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError) as exc:
                    # InvalidStateError: the stream ended between two keep-alives (etcd went
                    # away); a new one is opened for the next.
                    _log.info("etcd lease %s keep-alive failed: %r", self.id, exc)
                    if stream is not None:
                        stream.cancel()
                    stream = None
                    continue
                if response is grpc.aio.EOF:
                    stream = None
                    continue
                if response.TTL <= 0:
                    _log.warning("etcd lease %s has expired", self.id)
                    self.expire()
                    return
                if self.remaining() <= 0:
                    # Answered too late: etcd (restarted, say) may have let the lease go and
                    # another holder taken its keys meanwhile; a lost session stays lost.
                    _log.warning("etcd lease %s renewed past its ttl; reporting it lost", self.id)
                    self.expire()
                    return
                self.renewed_at = sent
        except Exception:  # noqa: BLE001 - whatever stopped them, the holder must hear of it
            _log.exception("etcd lease %s: keep-alives stopped; reporting it lost", self.id)
            self.expire()
        finally:
            if stream is not None:
                stream.cancel()

    async def close(self) -> None:
        """Revoke the lease, which deletes its keys; idempotent."""
        was_alive = self.alive
        self.expire()
        with contextlib.suppress(asyncio.CancelledError):
            await self._keep_alive
        if not was_alive:
            return
        try:
            await self._connection.call(
                self._connection.leases.LeaseRevoke,
                rpc.LeaseRevokeRequest(ID=self.lease_id),
                "revoke lease",
            )
        except StorageError as exc:
            # The keys still go: etcd expires the lease after its TTL.
            _log.warning("could not revoke etcd lease %s: %s", self.id, exc)
