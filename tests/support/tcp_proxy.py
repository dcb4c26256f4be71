"""A TCP relay on 127.0.0.1 in front of one server, which can cut chosen processes off it: a
network partition between those processes and the server, the others unaffected.

Each connection's owner (the process at the client end) is looked up when it is accepted.
While a process is cut off, the bytes of its connections are held rather than relayed (as a
partition drops packets: nothing fails at once, requests just get no answer) and its new
connections are never relayed. On healing, those connections are reset, as a long partition
leaves them; the process connects again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from tests.support.fault_proxy import LoopbackServer, reset_connection

CHUNK: Final = 1 << 16


@dataclass
class _Connection:
    owner: int | None
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None


@dataclass
class TcpFaultProxy:
    """See the module docstring. ``owner_of(port)`` names the process holding the client end
    of a connection from ``port`` (``None``: unknown, never cut off)."""

    upstream_port: int
    owner_of: Callable[[int], int | None]
    cut_connections: int = 0
    """Connections that were cut off (held, then reset), over the proxy's life."""
    _cut_off: set[int] = field(default_factory=set)
    _healed: asyncio.Event = field(default_factory=asyncio.Event)
    _connections: dict[asyncio.Task[None], _Connection] = field(default_factory=dict)
    _listener: LoopbackServer = field(init=False)

    def __post_init__(self) -> None:
        self._listener = LoopbackServer(self._serve)

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def __aenter__(self) -> TcpFaultProxy:
        self._healed.set()
        await self._listener.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._listener.stop()

    def cut_off(self, pids: set[int]) -> None:
        """From now on, hold the traffic of ``pids``' connections, new ones included."""
        self._cut_off |= pids
        self._healed.clear()

    def heal(self) -> None:
        """Reset the connections that were held; relay everything from now on."""
        for connection in self._connections.values():
            if connection.owner in self._cut_off:
                self.cut_connections += 1
                reset_connection(connection.client)
                if connection.upstream is not None:
                    reset_connection(connection.upstream)
        self._cut_off.clear()
        self._healed.set()

    def _is_cut_off(self, connection: _Connection) -> bool:
        return connection.owner is not None and connection.owner in self._cut_off

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = _Connection(self.owner_of(writer.get_extra_info("peername")[1]), writer)
        self._connections[task] = connection
        try:
            if self._is_cut_off(connection):
                await self._healed.wait()
                return  # reset by heal(): the client connects again
            up_reader, connection.upstream = await asyncio.open_connection(
                "127.0.0.1", self.upstream_port
            )
            await asyncio.gather(
                self._pump(connection, reader, connection.upstream),
                self._pump(connection, up_reader, writer),
            )
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            return  # the proxy is closing; ended here, asyncio's server logs no traceback
        finally:
            del self._connections[task]
            writer.close()
            if connection.upstream is not None:
                connection.upstream.close()

    async def _pump(
        self, connection: _Connection, source: asyncio.StreamReader, sink: asyncio.StreamWriter
    ) -> None:
        while data := await source.read(CHUNK):
            if self._is_cut_off(connection):
                await self._healed.wait()
                return  # the partition lost these bytes; heal() reset both ends
            sink.write(data)
            await sink.drain()
        with contextlib.suppress(OSError):
            sink.write_eof()
