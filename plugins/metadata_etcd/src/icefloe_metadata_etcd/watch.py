"""Watches on etcd's watch streams, resumed from the next revision after a broken stream.

etcd keeps the history of every key until it is compacted, so a watch whose stream breaks
(network, restart, leader change) asks again from the revision after the last one it
delivered and misses nothing. Only if that revision was compacted away does it start afresh
from now and deliver RESET. Each watch has its own stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Final

import grpc  # type: ignore[import-untyped]  # grpc ships no type information
from aetcd import rpc  # type: ignore[import-untyped]

from icefloe.adapters.watch_queue import WatchQueue
from icefloe.errors import UnavailableError
from icefloe.ports.metadata import EventKind, Watch, WatchEvent
from icefloe_metadata_etcd.connection import EtcdConnection
from icefloe_metadata_etcd.keys import KeySpace, prefix_end

_log = logging.getLogger(__name__)

_RETRY_DELAYS: Final = (0.05, 0.1, 0.2, 0.5, 1.0)


def _delays() -> Iterator[float]:
    yield from _RETRY_DELAYS
    while True:
        yield _RETRY_DELAYS[-1]


class _Compacted(Exception):
    """The revision to resume from is no longer in etcd's history."""


class EtcdWatch(Watch):
    """Changes under one prefix, holding at most ``limit`` undelivered events."""

    def __init__(
        self, connection: EtcdConnection, keyspace: KeySpace, prefix: str, limit: int
    ) -> None:
        """Use :meth:`open`, which returns once etcd has created the watch."""
        self._connection = connection
        self._keyspace = keyspace
        self._key = keyspace.stored(prefix) if prefix else keyspace.start
        self._range_end = prefix_end(keyspace.stored(prefix)) if prefix else keyspace.end
        self._queue = WatchQueue(limit)
        self._next_revision = 0
        """The revision to resume from: one after the last one accounted for."""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, connection: EtcdConnection, keyspace: KeySpace, prefix: str, limit: int
    ) -> EtcdWatch:
        watch = cls(connection, keyspace, prefix, limit)
        stream = await watch._create(start_revision=0)
        watch._task = asyncio.get_running_loop().create_task(
            watch._follow(stream), name="icefloe-etcd-watch"
        )
        return watch

    async def _create(self, start_revision: int) -> Any:
        """A stream whose watch etcd has created (from ``start_revision``, 0 meaning now).

        Raises:
            _Compacted: ``start_revision`` was compacted away.
            UnavailableError: etcd did not create the watch within the request timeout.
        """
        stream = self._connection.watches.Watch(metadata=self._connection.metadata)
        create = rpc.WatchCreateRequest(
            key=self._key, range_end=self._range_end, start_revision=start_revision
        )
        try:
            async with asyncio.timeout(self._connection.timeout):
                await stream.write(rpc.WatchRequest(create_request=create))
                response = await stream.read()
        except TimeoutError:
            stream.cancel()
            raise UnavailableError("etcd did not create the watch in time; retry later") from None
        except grpc.aio.AioRpcError as exc:
            raise UnavailableError(f"etcd watch: {exc.code().name} {exc.details()}") from exc
        if response is grpc.aio.EOF or not response.created:
            stream.cancel()
            raise UnavailableError("etcd did not create the watch; retry later")
        if response.compact_revision or response.canceled:
            stream.cancel()
            raise _Compacted
        if start_revision == 0:
            self._next_revision = response.header.revision + 1
        return stream

    async def _follow(self, stream: Any) -> None:
        delays = _delays()
        while not self._queue.closed:
            try:
                while (response := await stream.read()) is not grpc.aio.EOF:
                    if response.compact_revision or response.canceled:
                        raise _Compacted
                    self._take(response)
                    delays = _delays()
            except grpc.aio.AioRpcError as exc:
                _log.info("etcd watch stream broke (%s); resuming", exc.code().name)
            except _Compacted:
                self._next_revision = 0
            stream.cancel()
            stream = await self._resume(delays)

    async def _resume(self, delays: Iterator[float]) -> Any:
        while True:
            await asyncio.sleep(next(delays))
            if self._queue.closed:
                return None
            try:
                resumed = self._next_revision != 0
                stream = await self._create(self._next_revision)
            except _Compacted:
                self._next_revision = 0
                continue
            except UnavailableError:
                continue
            if not resumed:
                self._queue.reset()  # started afresh: changes in between are unknown
            return stream

    def _take(self, response: Any) -> None:
        for event in response.events:
            kind = EventKind.DELETE if event.type == rpc.Event.DELETE else EventKind.PUT
            key = self._keyspace.key_of(event.kv.key)
            self._queue.put(WatchEvent(kind, key, event.kv.mod_revision))
            self._next_revision = max(self._next_revision, event.kv.mod_revision + 1)
        if response.header.revision:
            # Progress beyond the last event (e.g. other keys' writes) need not be replayed.
            self._next_revision = max(self._next_revision, response.header.revision + 1)

    async def next_event(self) -> WatchEvent | None:
        return await self._queue.get()

    async def close(self) -> None:
        self._queue.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
