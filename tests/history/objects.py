"""The object store of a history run with object-store faults: a MinIO of the run's own (so
it can be killed), reached by the brokers through a fault proxy (so it can refuse, slow down,
answer stale listings, or see its uploader die between an upload and what follows).

With the object store on S3 and no WAL configured, the WAL is on the object store too: every
produce acknowledgement waits on requests through the proxy.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.testing.contract import open_backend
from tests.support.fault_proxy import FaultProxy, ProxyThread, classify_s3
from tests.support.object_servers import (
    BUCKET,
    MINIO_CREDENTIALS,
    Emulator,
    icefloe_on_minio,
    start_minio,
)
from tests.support.sockets import socket_holder

PREFIX: Final = "history"


class FaultyObjectStore:
    """MinIO behind a fault proxy; see the module docstring."""

    def __init__(self, folder: Path, seed: int, owner_of: Callable[[int], int | None]) -> None:
        """``owner_of(port)``: the broker at the client end of a connection from ``port``."""
        self.minio: Emulator = start_minio(folder)
        try:
            self._proxy = ProxyThread(
                FaultProxy(self.minio.port, classify_s3, record=False, seed=seed, owner_of=owner_of)
            )
        except BaseException:
            self.minio.process.stop()
            raise

    def settings(self, *, direct: bool = False) -> dict[str, str]:
        """What points ``serve`` at this store: through the proxy, or ``direct``."""
        return icefloe_on_minio(PREFIX, self.minio.url if direct else self._proxy.proxy.url)

    def readers(self) -> tuple[dict[str, str], dict[str, str]]:
        """What an engine reading the tables needs: Delta's storage options and pyiceberg's
        properties, as the S3 plugin hands them out (straight to MinIO)."""
        options: dict[str, Any] = {
            "bucket": BUCKET,
            "prefix": PREFIX,
            "region": "us-east-1",
            "endpoint_url": self.minio.url,
            **MINIO_CREDENTIALS,
        }
        return asyncio.run(_engine_settings(options))

    # --- faults (each returns once it is in place; the caller waits it out) ----------------

    def storm(self, seconds: float) -> None:
        self._proxy.call(self._proxy.proxy.storm, seconds, 0.5)

    def slow(self, seconds: float, latency: float) -> None:
        self._proxy.call(self._proxy.proxy.slow, seconds, latency)

    def stale_lists(self, seconds: float) -> None:
        self._proxy.call(self._proxy.proxy.stale_lists, seconds)

    def kill_next_uploader(self, candidates: list[int]) -> threading.Event:
        """SIGKILL whichever of ``candidates`` (or their children) makes the next upload, once
        MinIO has applied it and before it hears so; the event is set with :attr:`killed`."""
        done = threading.Event()
        self.killed: int | None = None

        def kill(address: tuple[str, int]) -> None:
            holder = socket_holder(address[1], candidates)
            if holder is not None:
                os.kill(holder[1], signal.SIGKILL)
                self.killed = holder[1]
            done.set()

        self._proxy.call(self._proxy.proxy.after_upload, kill)
        return done

    def cut_off(self, broker: int) -> None:
        self._proxy.call(self._proxy.proxy.cut_off, {broker})

    def cut_requests(self) -> int:
        """Requests left unanswered by :meth:`cut_off` so far."""
        return self._proxy.call(lambda: self._proxy.proxy.cut_requests)

    def heal(self) -> None:
        self._proxy.call(self._proxy.proxy.heal)

    def close(self) -> None:
        try:
            self._proxy.close()
        finally:
            self.minio.process.stop()


async def _engine_settings(options: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    store = await open_backend(PortKind.OBJECT_STORE, "s3", Path("."), options)
    assert isinstance(store, ObjectStore)
    try:
        return store.engine_options(), store.iceberg_properties()
    finally:
        await store.close()
