"""A broker's /livez and /readyz tell a stuck event loop and an unusable store from a healthy
broker, because they are served from a thread of their own."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from icefloe.broker.broker import Broker
from icefloe.broker.observability import LIVENESS_TIMEOUT_S
from icefloe.config import load_config
from tests.support.http import get


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    config = load_config(
        env={}, overrides={"data_dir": str(tmp_path), "compactor": {"enabled": False}}
    )
    broker = await Broker.open(config)
    await broker.start(port=0, metrics_port=0)
    yield broker
    await broker.stop()


def endpoint(broker: Broker, path: str) -> str:
    return f"http://{broker.me.host}:{broker.me.metrics_port}{path}"


async def test_livez_fails_while_the_event_loop_is_blocked(broker: Broker) -> None:
    assert (await asyncio.to_thread(get, endpoint(broker, "/livez")))[0] == 200
    with ThreadPoolExecutor(1) as pool:
        asked = pool.submit(get, endpoint(broker, "/livez"))
        time.sleep(LIVENESS_TIMEOUT_S + 1)  # noqa: ASYNC251 - the point: a handler that blocks
        status, text = asked.result()
    assert status == 503
    assert "event loop unresponsive" in text
    assert (await asyncio.to_thread(get, endpoint(broker, "/livez")))[0] == 200


async def test_readyz_names_a_store_that_cannot_be_used(broker: Broker) -> None:
    assert await asyncio.to_thread(get, endpoint(broker, "/readyz")) == (200, "ready\n")
    await broker.storage.object_store.close()

    status, text = await asyncio.to_thread(get, endpoint(broker, "/readyz"))

    assert status == 503
    assert text.startswith("object store unreachable:")


async def test_only_get_is_served(broker: Broker) -> None:
    request = urllib.request.Request(endpoint(broker, "/metrics"), data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        await asyncio.to_thread(urllib.request.urlopen, request, timeout=30)
    assert refused.value.code == 405


async def test_garbage_and_idle_peers_do_not_stop_the_endpoints(broker: Broker) -> None:
    def abuse() -> None:
        with socket.create_connection((broker.me.host, broker.me.metrics_port)) as peer:
            peer.sendall(os.urandom(4096) + b"\r\n\r\n")
            peer.recv(1024)  # a 400 or a close, never a hang
        with socket.create_connection((broker.me.host, broker.me.metrics_port)) as peer:
            peer.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X: " + b"y" * 200_000 + b"\r\n\r\n")
            peer.recv(1024)

    await asyncio.to_thread(abuse)
    status, text = await asyncio.to_thread(get, endpoint(broker, "/metrics"))
    assert status == 200
    assert "icefloe_memory_used_bytes" in text
