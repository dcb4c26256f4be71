"""The TCP proxy the history runs cut brokers off the metadata store with: it relays, it
leaves the chosen processes' connections unanswered while they are cut off (and theirs
only), and it resets them on healing so that their owners connect again."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests.support.sockets import socket_holder
from tests.support.tcp_proxy import TcpFaultProxy

pytestmark = pytest.mark.asyncio


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


@pytest_asyncio.fixture
async def proxy() -> AsyncIterator[TcpFaultProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    def owner(client_port: int) -> int | None:
        found = socket_holder(client_port, [os.getpid()])
        return None if found is None else found[0]

    async with TcpFaultProxy(port, owner) as relay:
        yield relay
    server.close()
    await server.wait_closed()


async def _round_trip(proxy: TcpFaultProxy, payload: bytes, within: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), within)
    finally:
        writer.close()


async def test_it_relays_both_ways(proxy: TcpFaultProxy) -> None:
    assert await _round_trip(proxy, b"hello") == b"hello"


async def test_a_process_cut_off_gets_no_answer_until_healed_then_is_reset(
    proxy: TcpFaultProxy,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"before")
    assert await reader.readexactly(6) == b"before"
    proxy.cut_off({os.getpid()})
    writer.write(b"during")
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(6), 0.5)  # held, as by a partition
    with pytest.raises(TimeoutError):
        await _round_trip(proxy, b"new connection", within=0.5)
    proxy.heal()
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(6), 2)  # reset, the held bytes lost
    writer.close()
    assert proxy.cut_connections == 2
    assert await _round_trip(proxy, b"after") == b"after"


async def test_other_processes_are_not_cut_off(proxy: TcpFaultProxy) -> None:
    proxy.cut_off({os.getpid() + 1_000_000})  # no such process
    assert await _round_trip(proxy, b"unaffected") == b"unaffected"
