"""Watches on Oxia's per-shard notification streams, filtered by prefix, with RESET on gaps.

Oxia notifications are namespace-wide: each watch follows every shard's stream and keeps the
changes under its prefix. Each watch opens its own streams: a new stream starts with a marker
batch at the shard's commit offset, so a watch sees exactly the changes committed after it was
established — a shared stream could hand a new watcher changes older than its start.

A stream that breaks (server restart, leader move) may have missed changes: the watch opens a
new stream and, once that is established, delivers RESET — not before, or a watcher re-reading
at once could miss what changed between its re-read and the new stream's start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, TypeAlias

import grpc  # type: ignore[import-untyped]  # grpc ships no type information

from icefloe.adapters.watch_queue import WatchQueue
from icefloe.errors import StorageError, UnavailableError
from icefloe.ports.metadata import EventKind, Watch, WatchEvent
from icefloe_metadata_oxia._proto import client_pb2 as pb
from icefloe_metadata_oxia.connection import OxiaConnection, Shard, backoff_delays
from icefloe_metadata_oxia.keys import KeySpace

_log = logging.getLogger(__name__)

_KIND = {
    pb.NotificationType.KEY_CREATED: EventKind.PUT,
    pb.NotificationType.KEY_MODIFIED: EventKind.PUT,
    pb.NotificationType.KEY_DELETED: EventKind.DELETE,
}

_Stream: TypeAlias = Any
"""A ``grpc.aio.UnaryStreamCall`` of notification batches (grpc has no type information)."""


class OxiaWatch(Watch):
    """Changes under one prefix, from every shard, holding at most ``limit`` undelivered."""

    def __init__(
        self, connection: OxiaConnection, keyspace: KeySpace, prefix: str, limit: int
    ) -> None:
        """Use :meth:`open`, which returns once every shard's stream is established."""
        self._connection = connection
        self._keyspace = keyspace
        self._prefix = prefix
        self._queue = WatchQueue(limit)
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(
        cls, connection: OxiaConnection, keyspace: KeySpace, prefix: str, limit: int
    ) -> OxiaWatch:
        watch = cls(connection, keyspace, prefix, limit)
        try:
            streams = await asyncio.gather(
                *(watch._establish(shard) for shard in connection.shards())
            )
        except BaseException:
            await watch.close()
            raise
        for shard, stream in zip(connection.shards(), streams, strict=True):
            task = asyncio.get_running_loop().create_task(
                watch._follow(shard, stream), name=f"icefloe-oxia-watch-{shard.id}"
            )
            watch._tasks.add(task)
        return watch

    async def _establish(self, shard: Shard) -> _Stream:
        """A new stream on ``shard``, once its position marker has arrived."""
        stream = self._connection.notifications(shard)
        try:
            async with asyncio.timeout(self._connection.timeout):
                marker = await stream.read()
        except TimeoutError:
            stream.cancel()
            raise UnavailableError(
                f"Oxia shard {shard.id} did not start a notification stream within "
                f"{self._connection.timeout}s; retry later"
            ) from None
        except grpc.aio.AioRpcError as exc:
            raise UnavailableError(
                f"Oxia notifications of shard {shard.id}: {exc.code().name}"
            ) from exc
        if marker is grpc.aio.EOF:
            raise UnavailableError(f"Oxia shard {shard.id} ended its notification stream")
        return stream

    async def _follow(self, shard: Shard, stream: _Stream) -> None:
        delays = backoff_delays()
        while not self._queue.closed:
            try:
                # read(), as for the marker: gRPC forbids mixing it with async iteration.
                while (batch := await stream.read()) is not grpc.aio.EOF:
                    self._take(batch)
                    delays = backoff_delays()
            except grpc.aio.AioRpcError as exc:
                _log.info("Oxia notification stream of shard %s broke: %s", shard.id, exc.code())
            stream.cancel()
            # Re-establish first, then RESET (see the module docstring).
            while not self._queue.closed:
                await asyncio.sleep(next(delays))
                with contextlib.suppress(StorageError):
                    current = {s.id: s for s in self._connection.shards()}.get(shard.id, shard)
                    stream = await self._establish(current)
                    break
            self._queue.reset()

    def _take(self, batch: pb.NotificationBatch) -> None:
        for stored in sorted(batch.notifications):
            notification = batch.notifications[stored]
            if notification.type == pb.NotificationType.KEY_RANGE_DELETED:
                # The adapter deletes ranges key by key; a range delete by another client
                # does not say which keys it removed.
                self._queue.reset()
                continue
            key = self._keyspace.key_of(stored)
            if key is None or not key.startswith(self._prefix):
                continue
            kind = _KIND[notification.type]
            # Versions are Oxia offsets plus one (offsets start at 0, versions at 1); a delete
            # carries no version, so it gets the offset of the write that deleted it.
            offset = notification.version_id if kind is EventKind.PUT else batch.offset
            self._queue.put(WatchEvent(kind, key, offset + 1))

    async def next_event(self) -> WatchEvent | None:
        return await self._queue.get()

    def stop(self) -> None:
        """End the watch now: ``next_event`` returns ``None`` from here on."""
        self._queue.close()
        for task in self._tasks:
            task.cancel()

    async def close(self) -> None:
        self.stop()
        tasks = list(self._tasks)
        self._tasks.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
