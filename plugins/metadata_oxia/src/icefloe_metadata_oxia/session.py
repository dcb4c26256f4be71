"""Port sessions on Oxia sessions: one per shard, kept alive by a heartbeat task.

An Oxia session belongs to one shard, and an ephemeral key must name a session of the shard
that stores it, so a port session holds one Oxia session per shard (opened up front for the
shards known at the time, later ones on first use). The server deletes a session's keys when
it closes or misses heartbeats for its timeout. The port session reports itself lost once that
timeout has passed since the last heartbeat the servers answered was *sent* (a heartbeat still
unanswered then is given up): a server may have expired the session by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Final

from icefloe.errors import SessionExpiredError, StorageError
from icefloe.ports.metadata import Session
from icefloe_metadata_oxia._proto import client_pb2 as pb
from icefloe_metadata_oxia.connection import OxiaConnection, Shard

_log = logging.getLogger(__name__)

MIN_TTL: Final = 2.0
"""Oxia's shortest session timeout (``constant.MinSessionTimeout``); shorter ttls are raised."""


class OxiaSession(Session):
    """A liveness session; ``ttl`` is the effective timeout (at least :data:`MIN_TTL`)."""

    def __init__(self, connection: OxiaConnection, ttl: float) -> None:
        """Use :meth:`open`."""
        self.id = uuid.uuid4().hex
        self.ttl = max(ttl, MIN_TTL)
        self._connection = connection
        self._oxia_ids: dict[int, int] = {}
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.renewed_at = time.monotonic()  # before the first session is created: a safe bound
        self._heartbeat: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, connection: OxiaConnection, ttl: float) -> OxiaSession:
        session = cls(connection, ttl)
        try:
            for shard in connection.shards():
                await session.oxia_id(shard)
        except BaseException:
            await session.close()
            raise
        session._heartbeat = asyncio.get_running_loop().create_task(
            session._heartbeat_forever(), name=f"icefloe-oxia-session-{session.id[:8]}"
        )
        return session

    @property
    def lost(self) -> asyncio.Future[None]:
        return self._lost

    @property
    def client_identity(self) -> str:
        return self.id

    async def oxia_id(self, shard: Shard) -> int:
        """The Oxia session id of this session on ``shard``, creating it on first use.

        Raises:
            SessionExpiredError: the session is closed or expired.
        """
        if not self.alive:
            raise SessionExpiredError(f"session {self.id} is closed or expired; open a new one")
        found = self._oxia_ids.get(shard.id)
        if found is None:
            request = pb.CreateSessionRequest(
                shard=shard.id,
                session_timeout_ms=round(self.ttl * 1000),
                client_identity=self.client_identity,
            )
            response = await self._connection.unary(
                shard, "CreateSession", request, pb.CreateSessionResponse, "create session"
            )
            found = self._oxia_ids[shard.id] = response.session_id
        return found

    def expire(self) -> None:
        if not self._lost.done():
            self._lost.set_result(None)

    async def _heartbeat_forever(self) -> None:
        # Several beats per timeout (the port's cadence): one lost beat is not yet an expiry.
        sent = self.renewed_at
        while self.alive:
            await asyncio.sleep(self.until_keep_alive(sent))
            sent = time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, self.remaining())):
                    await self._beat()
            except SessionExpiredError:
                _log.warning("Oxia session %s expired on the server", self.id)
                self.expire()
                return
            except (StorageError, TimeoutError) as exc:
                # The server may still hold the session, but past the timeout it may not:
                # report the loss rather than let the holder act on a dead session.
                if self.remaining() <= 0:
                    _log.warning("Oxia session %s: no heartbeat for its ttl (%r)", self.id, exc)
                    self.expire()
                continue
            if self.remaining() <= 0:
                _log.warning("Oxia session %s renewed past its ttl; reporting it lost", self.id)
                self.expire()
                return
            self.renewed_at = sent

    async def _beat(self) -> None:
        shards = {shard.id: shard for shard in self._connection.shards()}
        for shard_id, oxia_id in list(self._oxia_ids.items()):
            shard = shards.get(shard_id)
            if shard is not None:
                await self._connection.unary(
                    shard,
                    "KeepAlive",
                    pb.SessionHeartbeat(shard=shard_id, session_id=oxia_id),
                    pb.KeepAliveResponse,
                    "session heartbeat",
                )

    async def close(self) -> None:
        """Close the Oxia sessions, which deletes their ephemeral keys; idempotent."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
            self._heartbeat = None
        was_alive = self.alive
        self.expire()
        if not was_alive:
            return
        shards = {shard.id: shard for shard in self._connection.shards()}
        oxia_ids, self._oxia_ids = self._oxia_ids, {}
        for shard_id, oxia_id in oxia_ids.items():
            shard = shards.get(shard_id)
            if shard is None:
                continue
            try:
                await self._connection.unary(
                    shard,
                    "CloseSession",
                    pb.CloseSessionRequest(shard=shard_id, session_id=oxia_id),
                    pb.CloseSessionResponse,
                    "close session",
                )
            except StorageError as exc:
                # The keys still go: the server expires the session after its timeout.
                _log.warning("could not close Oxia session %s: %s", self.id, exc)
