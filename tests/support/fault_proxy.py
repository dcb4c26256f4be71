"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, in front of one emulator.

A client pointed at :attr:`FaultProxy.url` reaches the emulator through it. The proxy can be
told to fail the next N requests of a kind (PUT, GET, …):

- ``fail_next``: answer with an error status (503 SlowDown, 500, 429) without forwarding;
- ``reset_next``: take part of the request body, then reset the connection (an upload cut
  off mid-way: nothing reaches the server);
- ``lose_response_next``: forward the request, let the server apply it, then reset the
  connection instead of answering (the client cannot tell that its write succeeded).

or to misbehave for a while, whatever the requests:

- ``storm``: answer a share of them 503 SlowDown;
- ``slow``: hold each one for seconds before forwarding it;
- ``stale_lists``: answer each listing as it was answered before the window opened;

or to call back once the next upload has been applied, before answering it (``after_upload``:
the caller kills the uploader there, between its upload and what it would do next); or to cut
chosen processes off the store (``cut_off``, given ``owner_of``): their requests get no answer
until the proxy heals, then their connections are reset.

Every request is recorded in :attr:`FaultProxy.seen` with its kind and what the proxy did, so
tests can compare an adapter's request counters with the requests really made.

It handles one request per client connection (it answers ``Connection: close``), and holds a
request and its answer in memory: it is made for tests, not for speed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import socket
import struct
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, TypeVar

from icefloe.ports.object_store import RequestKind

P = TypeVar("P", bound=contextlib.AbstractAsyncContextManager[Any])
T = TypeVar("T")

Classifier = Callable[[str, str], RequestKind]
"""``(method, target) -> kind``: how a backend's HTTP requests map to request kinds."""

Action = Literal["forward", "status", "reset", "lose_response", "stale"]

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
class Window:
    """A fault applied to every request until ``until`` (``time.monotonic()``)."""

    action: Literal["storm", "slow", "stale_lists"]
    until: float
    share: float = 1.0
    """For ``storm``: the share of requests refused."""
    latency: float = 0.0
    """For ``slow``: seconds each request is held."""


MAX_REMEMBERED_LISTS: Final = 256
"""Listings whose last answer is kept for ``stale_lists`` (by request target)."""


@dataclass(frozen=True)
class Seen:
    method: str
    target: str
    kind: RequestKind
    action: Action


@dataclass
class LoopbackServer:
    """A server on 127.0.0.1 whose open connections are cancelled when it stops: what both
    fault proxies (this one and :mod:`tests.support.tcp_proxy`) serve with."""

    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._tracked, "127.0.0.1", 0, limit=1 << 16)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _tracked(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self.serve(reader, writer)
        finally:
            self._tasks.discard(task)


@dataclass
class FaultProxy:
    """See the module docstring. Use as ``async with FaultProxy(port, classify) as proxy``."""

    upstream_port: int
    classify: Classifier
    record: bool = True
    """Whether to keep every request in :attr:`seen` (off for long runs)."""
    seed: int = 0
    owner_of: Callable[[int], int | None] | None = None
    """For ``cut_off``: the process holding the client end of a connection from a port."""
    cut_requests: int = 0
    """Requests left unanswered by ``cut_off``, over the proxy's life."""
    seen: list[Seen] = field(default_factory=list)
    _faults: list[Fault] = field(default_factory=list)
    _windows: list[Window] = field(default_factory=list)
    _lists: OrderedDict[str, bytes] = field(default_factory=OrderedDict)
    _after_upload: Callable[[tuple[str, int]], None] | None = None
    _cut_off: set[int] = field(default_factory=set)
    _healed: asyncio.Event = field(default_factory=asyncio.Event)
    _random: random.Random = field(init=False)
    _listener: LoopbackServer = field(init=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._listener = LoopbackServer(self._serve)

    @property
    def port(self) -> int:
        return self._listener.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FaultProxy:
        self._healed.set()
        await self._listener.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._listener.stop()

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

    def storm(self, seconds: float, share: float = 0.5) -> None:
        """For ``seconds``, answer ``share`` of the requests 503 SlowDown, unforwarded."""
        self._windows.append(Window("storm", time.monotonic() + seconds, share=share))

    def slow(self, seconds: float, latency: float) -> None:
        """For ``seconds``, hold each request ``latency`` seconds before forwarding it."""
        self._windows.append(Window("slow", time.monotonic() + seconds, latency=latency))

    def stale_lists(self, seconds: float) -> None:
        """For ``seconds``, answer each listing with its last answer from before (a listing
        never answered before is forwarded)."""
        self._windows.append(Window("stale_lists", time.monotonic() + seconds))

    def after_upload(self, callback: Callable[[tuple[str, int]], None]) -> None:
        """Once the next upload has been applied, call ``callback`` with the uploader's
        address (host, port) before answering; then reset the connection."""
        self._after_upload = callback

    def cut_off(self, pids: set[int]) -> None:
        """Until :meth:`heal`, leave the requests of ``pids`` unanswered (needs ``owner_of``)."""
        assert self.owner_of is not None, "cut_off needs owner_of"
        self._cut_off |= pids
        self._healed.clear()

    def heal(self) -> None:
        """Forget the faults not yet used: forward everything from now on."""
        self._faults.clear()
        self._windows.clear()
        self._after_upload = None
        self._cut_off.clear()
        self._healed.set()

    def tally(self) -> dict[str, int]:
        """Requests seen, by kind (every kind present, zeros included)."""
        counts = Counter(seen.kind.value for seen in self.seen)
        return {kind.value: counts[kind.value] for kind in RequestKind}

    # --- serving ------------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut_off and self._owner(writer) in self._cut_off:
            self.cut_requests += 1
            await self._healed.wait()  # unanswered, as behind a partition
            reset_connection(writer)
            return
        head = await reader.readuntil(b"\r\n\r\n")
        request_line, headers = _parse_head(head)
        method, target, _ = request_line.split(" ", 2)
        kind = self.classify(method, target)
        fault = self._take_fault(kind) or self._window_fault(kind)
        stale = self._stale_answer(kind, target) if fault is None else None
        action: Action = fault.action if fault else "stale" if stale else "forward"
        if self.record:
            self.seen.append(Seen(method, target, kind, action))
        await asyncio.sleep(self._latency())
        if headers.get("expect", "").lower() == "100-continue":
            if fault is not None and fault.action == "status":
                await _answer(writer, fault.status, fault.body)  # refused before the body
                return
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        if fault is not None and fault.action == "reset":
            length = int(headers.get("content-length", "0"))
            await reader.readexactly(int(length * fault.body_fraction))
            reset_connection(writer)
            return
        body = await _read_body(reader, headers)
        if fault is not None and fault.action == "status":
            await _answer(writer, fault.status, fault.body)
            return
        if stale is not None:
            writer.write(stale)
            await writer.drain()
            return
        response = await self._forward(_without_expect(head), body)
        if kind == RequestKind.LIST:
            self._remember_list(target, response)
        if kind == RequestKind.PUT and self._after_upload is not None:
            callback, self._after_upload = self._after_upload, None
            callback(writer.get_extra_info("peername")[:2])
            reset_connection(writer)
            return
        if fault is not None and fault.action == "lose_response":
            reset_connection(writer)
            return
        writer.write(response)
        await writer.drain()

    def _owner(self, writer: asyncio.StreamWriter) -> int | None:
        if self.owner_of is None:
            return None
        return self.owner_of(writer.get_extra_info("peername")[1])

    def _live_windows(self, action: str) -> list[Window]:
        now = time.monotonic()
        self._windows = [w for w in self._windows if w.until > now]
        return [w for w in self._windows if w.action == action]

    def _window_fault(self, kind: RequestKind) -> Fault | None:
        for window in self._live_windows("storm"):
            if self._random.random() < window.share:
                return Fault(kind, 0, "status")
        return None

    def _latency(self) -> float:
        return max((w.latency for w in self._live_windows("slow")), default=0.0)

    def _stale_answer(self, kind: RequestKind, target: str) -> bytes | None:
        if kind != RequestKind.LIST or not self._live_windows("stale_lists"):
            return None
        return self._lists.get(target)

    def _remember_list(self, target: str, response: bytes) -> None:
        if self._live_windows("stale_lists"):
            return  # keep the answer from before the window
        self._lists[target] = response
        self._lists.move_to_end(target)
        while len(self._lists) > MAX_REMEMBERED_LISTS:
            self._lists.popitem(last=False)

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


def reset_connection(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed server or a middlebox would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ProxyThread(Generic[P]):
    """A proxy (:class:`FaultProxy`, :class:`~tests.support.tcp_proxy.TcpFaultProxy`) on an
    event loop of its own, for synchronous callers: its methods are called on that loop
    through :meth:`call`."""

    def __init__(self, proxy: P) -> None:
        self.proxy = proxy
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="fault-proxy", daemon=True
        )
        self._thread.start()
        asyncio.run_coroutine_threadsafe(proxy.__aenter__(), self._loop).result(10)

    def call(self, method: Callable[..., T], *args: object) -> T:
        """``method(*args)`` run on the proxy's loop; its result."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                done.set_result(method(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                done.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return done.result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.proxy.__aexit__(None, None, None), self._loop).result(
            10
        )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


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
