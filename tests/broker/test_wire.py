"""A connection's byte stream over real sockets: exact reads however the bytes arrive, short
reads when the client goes away, and bounded buffering when the broker does not read or the
client does not read."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest

from icefloe.broker.wire import DIRECT_BYTES, READ_AHEAD_BYTES, WRITE_SLICE_BYTES, Wire


@pytest.fixture
async def connected() -> AsyncIterator[tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter]]:
    """A server-side Wire and the client's stream end of its connection."""
    accepted: asyncio.Queue[Wire] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Wire(accepted.put_nowait), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    wire = await asyncio.wait_for(accepted.get(), 10)
    try:
        yield wire, reader, writer
    finally:
        writer.close()
        wire.abort()
        server.close()
        await server.wait_closed()


async def send_in_pieces(writer: asyncio.StreamWriter, data: bytes, piece: int) -> None:
    for start in range(0, len(data), piece):
        writer.write(data[start : start + piece])
        await writer.drain()
        await asyncio.sleep(0)


async def test_reads_of_every_size_get_exactly_the_bytes_sent_in_any_pieces(
    connected: tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    wire, _, writer = connected
    sizes = [4, 10, DIRECT_BYTES - 1, DIRECT_BYTES, 4, 3 * READ_AHEAD_BYTES, 1, 2 << 20, 7]
    data = os.urandom(sum(sizes))
    for piece in (1_000, 70_000):
        sending = asyncio.create_task(send_in_pieces(writer, data, piece))
        got = [await asyncio.wait_for(wire.read_exactly(size), 30) for size in sizes]
        await sending

        assert [len(chunk) for chunk in got] == sizes
        assert b"".join(got) == data


@pytest.mark.parametrize("size", [10, DIRECT_BYTES * 4], ids=["read-ahead", "direct"])
async def test_a_client_that_closes_inside_a_read_gives_a_short_read(
    connected: tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter], size: int
) -> None:
    wire, _, writer = connected
    writer.write(b"x" * (size - 3))
    await writer.drain()
    writer.close()

    with pytest.raises(asyncio.IncompleteReadError) as caught:
        await asyncio.wait_for(wire.read_exactly(size), 30)
    assert caught.value.partial == b"x" * (size - 3)
    assert caught.value.expected == size


async def test_a_client_that_sends_while_nothing_is_read_is_held_back(
    connected: tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    wire, _, writer = connected
    data = os.urandom(16 << 20)
    writer.write(data)
    await asyncio.sleep(0.5)  # the client keeps sending what TCP lets through

    assert wire.transport is not None
    assert not wire.transport.is_reading()
    assert wire.buffered_bytes() <= READ_AHEAD_BYTES
    got = await asyncio.wait_for(wire.read_exactly(len(data)), 30)
    assert got == data


async def test_writes_reach_the_client_and_closing_is_seen_by_both_ends(
    connected: tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    wire, reader, _ = connected
    payload = os.urandom(4 << 20)
    # The client reads while the broker drains: more than the socket buffers hold stays in
    # the transport until the client has read enough of it.
    receiving = asyncio.create_task(reader.readexactly(len(payload)))
    wire.write(payload)
    await asyncio.wait_for(wire.drain(), 30)
    wire.close()

    assert await asyncio.wait_for(receiving, 30) == payload
    assert await asyncio.wait_for(reader.read(), 30) == b""
    await asyncio.wait_for(wire.wait_closed(), 10)


async def test_a_large_response_is_copied_a_slice_at_a_time_while_the_client_does_not_read(
    connected: tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    wire, reader, _ = connected
    assert wire.transport is not None
    # More than the sockets' buffers hold, so that the transport has to keep some of it.
    parts = [os.urandom(12 << 20), b"between", bytearray(os.urandom(20 << 20))]
    buffered: list[int] = []
    writing = asyncio.create_task(wire.write_all(parts))
    while not writing.done() and len(buffered) < 100_000:
        buffered.append(wire.transport.get_write_buffer_size())
        await asyncio.sleep(0)
        if len(buffered) > 1_000 and buffered[-1] == buffered[-1_000]:
            break  # the client's end is full: the writer waits for it

    assert not writing.done()
    _, high_water = wire.transport.get_write_buffer_limits()
    assert 0 < max(buffered) <= high_water + WRITE_SLICE_BYTES
    got = await asyncio.wait_for(reader.readexactly(sum(len(p) for p in parts)), 30)
    await asyncio.wait_for(writing, 30)
    assert got == b"".join(parts)


async def test_a_write_after_the_connection_closed_is_a_connection_error(
    connected: tuple[Wire, asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    wire, _, _ = connected
    wire.close()

    with pytest.raises(ConnectionResetError):
        wire.write(b"too late")
