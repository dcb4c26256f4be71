"""A broker's /livez and /readyz tell a stuck event loop and an unusable store from a healthy
broker, because they are served from a thread of their own."""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import trustme

from icefloe.broker.broker import Broker
from icefloe.broker.observability import LIVENESS_TIMEOUT_S
from icefloe.config import load_config
from icefloe.errors import ConfigError
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


async def test_the_endpoints_are_served_over_tls_when_asked(tmp_path: Path) -> None:
    authority = trustme.CA()
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "broker.pem")
    )
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path / "data"),
            "compactor": {"enabled": False},
            "metrics": {"tls": True},
            "security": {"tls": {"certfile": str(tmp_path / "broker.pem")}},
        },
    )
    broker = await Broker.open(config)
    await broker.start(port=0, metrics_port=0)
    try:
        url = f"https://127.0.0.1:{broker.me.metrics_port}/livez"
        trusting = ssl.create_default_context()
        authority.configure_trust(trusting)

        def fetch(context: ssl.SSLContext | None, address: str = url) -> str:
            with urllib.request.urlopen(address, timeout=30, context=context) as response:
                return str(response.read().decode())

        assert (await asyncio.to_thread(fetch, trusting)).startswith("ok")
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            await asyncio.to_thread(fetch, ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            await asyncio.to_thread(fetch, None, url.replace("https", "http"))
        # A failed handshake cost the endpoints nothing.
        assert (await asyncio.to_thread(fetch, trusting)).startswith("ok")
    finally:
        await broker.stop()


async def test_tls_endpoints_without_a_certificate_name_the_setting(tmp_path: Path) -> None:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "compactor": {"enabled": False},
            "metrics": {"tls": True},
        },
    )
    broker = await Broker.open(config)
    try:
        with pytest.raises(ConfigError, match=r"\[security.tls\] certfile"):
            await broker.start(port=0, metrics_port=0)
    finally:
        await broker.stop()
