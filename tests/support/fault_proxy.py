"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, in front of one emulator.

A client pointed at :attr:`FaultProxy.url` reaches the emulator through it. The proxy can be
told to fail the next N requests of a kind (PUT, GET, …):

- ``fail_next``: answer with an error status (503 SlowDown, 500, 429) without forwarding;
- ``reset_next``: take part of the request body, then reset the connection (an upload cut
  off mid-way: nothing reaches the server);
- ``lose_response_next``: forward the request, let the server apply it, then reset the
  connection instead of answering (the client cannot tell that its write succeeded).

Every request is recorded in :attr:`FaultProxy.seen` with its kind and what the proxy did, so
tests can compare an adapter's request counters with the requests really made.

It handles one request per client connection (it answers ``Connection: close``), and holds a
request and its answer in memory: it is made for tests, not for speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Literal

from icefloe.ports.object_store import RequestKind

Classifier = Callable[[str, str], RequestKind]
"""``(method, target) -> kind``: how a backend's HTTP requests map to request kinds."""

Action = Literal["forward", "status", "reset", "lose_response"]

SLOW_DOWN: Final = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Fault:
    kind: RequestKind
    remaining: int
    action: Action
    status: int = 503
    body: bytes = SLOW_DOWN
    body_fraction: float = 0.5
    """For ``reset``: the share of the request body taken before the reset."""


@dataclass(frozen=True)
class Seen:
    method: str
    target: str
    kind: RequestKind
    action: Action


@dataclass
class FaultProxy:
    """See the module docstring. Use as ``async with FaultProxy(port, classify) as proxy``."""

    upstream_port: int
    classify: Classifier
    seen: list[Seen] = field(default_factory=list)
    _faults: list[Fault] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _connections: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 16)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    # --- telling it what to do ----------------------------------------------------------------

    def fail_next(
        self, count: int, kind: RequestKind, status: int = 503, body: bytes = SLOW_DOWN
    ) -> None:
        """Answer the next ``count`` requests of ``kind`` with ``status``, unforwarded."""
        self._faults.append(Fault(kind, count, "status", status, body))

    def reset_next(self, count: int, kind: RequestKind, body_fraction: float = 0.5) -> None:
        """Reset the next ``count`` requests of ``kind`` after part of their body."""
        self._faults.append(Fault(kind, count, "reset", body_fraction=body_fraction))

    def lose_response_next(self, count: int, kind: RequestKind) -> None:
        """Forward the next ``count`` requests of ``kind``, then drop their answers."""
        self._faults.append(Fault(kind, count, "lose_response"))

    def heal(self) -> None:
        """Forget the faults not yet used: forward everything from now on."""
        self._faults.clear()

    def tally(self) -> dict[str, int]:
        """Requests seen, by kind (every kind present, zeros included)."""
        counts = Counter(seen.kind.value for seen in self.seen)
        return {kind.value: counts[kind.value] for kind in RequestKind}

    # --- serving ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, headers = _parse_head(head)
        method, target, _ = request_line.split(" ", 2)
        kind = self.classify(method, target)
        fault = self._take_fault(kind)
        action: Action = fault.action if fault else "forward"
        self.seen.append(Seen(method, target, kind, action))
        if headers.get("expect", "").lower() == "100-continue":
            if fault is not None and fault.action == "status":
                await _answer(writer, fault.status, fault.body)  # refused before the body
                return
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if fault is not None and fault.action == "reset":
            length = int(headers.get("content-length", "0"))
            await reader.readexactly(int(length * fault.body_fraction))
            _reset(writer)
            return
        body = await _read_body(reader, headers)
        if fault is not None and fault.action == "status":
            await _answer(writer, fault.status, fault.body)
            return
        response = await self._forward(_without_expect(head), body)
        if fault is not None and fault.action == "lose_response":
            _reset(writer)
            return
        writer.write(response)
        await writer.drain()

    def _take_fault(self, kind: RequestKind) -> Fault | None:
        for fault in self._faults:
            if fault.kind == kind and fault.remaining > 0:
                fault.remaining -= 1
                return fault
        return None

    async def _forward(self, head: bytes, body: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            writer.write(_with_connection_close(head) + body)
            await writer.drain()
            response = await reader.read()  # the upstream closes after one answer
        finally:
            writer.close()
        response_head, _, response_body = response.partition(b"\r\n\r\n")
        return _with_connection_close(response_head + b"\r\n\r\n") + response_body


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def _header_lines(head: bytes) -> list[bytes]:
    return head.rstrip(b"\r\n").split(b"\r\n")


def _with_connection_close(head: bytes) -> bytes:
    lines = [line for line in _header_lines(head) if not line.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def _without_expect(head: bytes) -> bytes:
    lines = [line for line in _header_lines(head) if not line.lower().startswith(b"expect:")]
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    """The request body, raw (chunked encoding kept as sent, since it is forwarded as is)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raw = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            raw += size_line
            size = int(size_line.split(b";")[0], 16)
            raw += await reader.readexactly(size + 2)
            if size == 0:
                # Trailers (if any) end with an empty line; the last read took its CRLF only
                # when there were none.
                if not raw.endswith(b"\r\n\r\n"):
                    raw += await reader.readuntil(b"\r\n\r\n")
                return bytes(raw)
    return await reader.readexactly(int(headers.get("content-length", "0")))


async def _answer(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    writer.write(
        f"HTTP/1.1 {status} Injected\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


# --- how each backend's requests map to kinds (read off the wire, not from the adapters) ---


def classify_s3(method: str, target: str) -> RequestKind:
    if method in ("PUT", "POST"):
        return RequestKind.PUT  # PutObject, UploadPart, Create/CompleteMultipartUpload
    if method == "HEAD":
        return RequestKind.HEAD
    if method == "DELETE":
        return RequestKind.DELETE
    return RequestKind.LIST if "list-type=2" in target else RequestKind.GET


def classify_gcs(method: str, target: str) -> RequestKind:
    path, _, query = target.partition("?")
    if method in ("PUT", "POST"):
        return RequestKind.PUT  # one-shot uploads, resumable sessions and their chunks
    if method == "DELETE":
        return RequestKind.DELETE
    if "alt=media" in query or path.startswith("/download/"):
        return RequestKind.GET
    return RequestKind.LIST if path.endswith("/o") else RequestKind.HEAD


def classify_azure(method: str, target: str) -> RequestKind:
    if method == "PUT":
        return RequestKind.PUT  # Put Blob, Put Block, Put Block List
    if method == "HEAD":
        return RequestKind.HEAD
    if method == "DELETE":
        return RequestKind.DELETE
    return RequestKind.LIST if "comp=list" in target else RequestKind.GET
