"""The asyncio Kafka server: frames in, handlers, responses out in request order.

Each connection reads size-prefixed frames, decodes each request and starts its handler at
once, so a client can pipeline; a writer task sends the responses strictly in request order.
Produce hands each partition's batches to the writer in request order
(:mod:`icefloe.broker.submit_order`). Produce with acks=0 gets no response. A frame over the size
limit, an unknown API, an unsupported version (other than ApiVersions, which answers
UNSUPPORTED_VERSION as Kafka does) or bytes that do not decode close the connection: the
client sees a disconnect, every other connection goes on, and nothing is stored.

Every request holds its bytes, and then its response's, in its connection's budget and the
broker's (:mod:`icefloe.broker.memory`) until the response is sent; a connection reads its next
frame only when both have room.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from icefloe import metrics
from icefloe.broker import protocol
from icefloe.broker.answered_errors import errors_in
from icefloe.broker.apis import SUPPORTED_APIS, Api
from icefloe.broker.memory import ByteBudget, Held
from icefloe.broker.protocol import ProtocolError, Request
from icefloe.broker.submit_order import SubmitOrder
from icefloe.broker.wire import Wire
from icefloe.cluster import client_zone
from icefloe.config.security import Protocol
from icefloe.security import tls
from icefloe.security.acls import ANONYMOUS, CLUSTER_NAME, Operation, ResourceType
from icefloe.security.sasl import SaslExchange

if TYPE_CHECKING:
    from icefloe.broker.broker import Broker

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
CLOSE_GRACE_S = 5.0
"""How long a closing connection may take to send what it still has queued."""
DOOMED_LINGER_S: Final = 1.0
"""How long a connection closed by the broker (a failed login) stays open after its last
answer, for the client to read it and close first."""

Handler = Callable[["RequestContext", Any], Awaitable[Any]]


TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
"""A client that has not finished its TLS handshake by then is disconnected."""


@dataclass(frozen=True)
class Listener:
    """One address the broker listens on, and how clients there must connect."""

    protocol: Protocol
    ssl: ssl.SSLContext | None = None

    @property
    def name(self) -> str:
        return self.protocol.value


PLAINTEXT: Final = Listener(Protocol.PLAINTEXT)

_BEFORE_AUTHENTICATION: Final = frozenset({18, 17, 36})
"""What a SASL listener serves before the login: ApiVersions, SaslHandshake, SaslAuthenticate."""


@dataclass
class Connection:
    """Per-connection state shared by the handlers of its requests."""

    peer: str
    budget: ByteBudget
    """Bytes this connection's unanswered requests and unsent responses hold."""
    listener: str = PLAINTEXT.name
    """The name of the listener the client connected through."""
    needs_login: bool = False
    """Whether requests other than the login's wait for a SASL login (a SASL listener)."""
    sasl: SaslExchange | None = None
    """The login in progress, from SaslHandshake on."""
    host: str = ""
    """The client's address, as ACLs name hosts."""
    principal: str | None = None
    """Who logged in (SASL), once they have."""
    certificate_principal: str | None = None
    """``User:<distinguished name>`` of a client certificate (mutual TLS), as Kafka names it."""
    login_expires: float | None = None
    """When the login must have been renewed (``time.monotonic()``; KIP-368), if ever."""
    doomed: bool = False
    """Closed once the response being sent is out (a failed login)."""
    submit_order: SubmitOrder = field(default_factory=SubmitOrder)
    """The order in which produce requests hand each partition's batches to the writer."""
    holds: set[Held] = field(default_factory=set)
    """Memory held by requests not answered yet, released at the latest when it closes."""
    throttled_until: float = 0.0
    """While a client over its quota is throttled (``time.monotonic()``), else 0: no request
    of the connection is started before then (:mod:`icefloe.broker.quotas`)."""


@dataclass(frozen=True)
class RequestContext:
    """What a handler knows besides the request body."""

    broker: Broker
    connection: Connection
    request: Request
    held: Held
    """The memory this request holds; a handler that builds a large response (fetch) sizes it
    with :meth:`Held.take_up_to` first."""

    @property
    def api_version(self) -> int:
        return self.request.api_version

    @property
    def client_id(self) -> str:
        return self.request.client_id or ""

    @property
    def principal(self) -> str:
        """Who sends the request, as ACLs name principals: the SASL login, else the client
        certificate's subject, else ``User:ANONYMOUS``."""
        connection = self.connection
        if connection.principal is not None:
            return f"User:{connection.principal}"
        return connection.certificate_principal or ANONYMOUS

    def allows(
        self, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME
    ) -> bool:
        """Whether the ACLs let this request's principal do ``operation`` on the resource."""
        return self.broker.authorizer.allows(
            self.principal, self.connection.host, operation, resource_type, name
        )

    def response_module(self) -> Any:
        """The kio module with this request version's response classes."""
        return protocol.response_module(self.request.api_key, self.request.api_version)


class NoResponse:
    """Returned by a handler when the request gets no response (produce with acks=0)."""


NO_RESPONSE = NoResponse()


class KafkaServer:
    """Accepts Kafka connections for one broker."""

    def __init__(self, broker: Broker, memory: ByteBudget) -> None:
        self._broker = broker
        self._options = broker.options
        self._memory = memory
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        self._handlers: dict[int, Handler] = {}

    async def start(self, host: str, port: int, listener: Listener = PLAINTEXT) -> int:
        """Bind one more address; return the bound port (useful with port 0). Connections
        wait in the listen backlog until :meth:`accept` is called."""
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: Wire(functools.partial(self._accept, listener)),
            host,
            port,
            reuse_address=True,
            ssl=listener.ssl,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if listener.ssl else None,
            start_serving=False,
        )
        self._servers.append(server)
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    async def accept(self) -> None:
        """Start taking the connections of every address bound."""
        for server in self._servers:
            await server.start_serving()

    async def close(self) -> None:
        """Stop accepting, then close every connection."""
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()

    def handler(self, api: Api) -> Handler:
        handler = self._handlers.get(api.key)
        if handler is None:
            module, _, name = api.handler.partition(":")
            handler = self._handlers[api.key] = getattr(importlib.import_module(module), name)
        return handler

    def _accept(self, listener: Listener, wire: Wire) -> None:
        task = asyncio.create_task(self._serve(listener, wire))
        self._connections.add(task)

    async def _serve(self, listener: Listener, wire: Wire) -> None:
        task = asyncio.current_task()
        metrics.CONNECTIONS_ACCEPTED.inc()
        metrics.CONNECTIONS.inc()
        address = wire.get_extra_info("peername")
        peer = str(address)
        connection = Connection(
            peer,
            ByteBudget(self._options.max_inflight_bytes),
            listener.name,
            needs_login=listener.protocol.sasl,
            host=str(address[0]) if isinstance(address, tuple) and address else "",
        )
        if listener.ssl is not None:
            connection.certificate_principal = tls.certificate_principal(
                wire.get_extra_info("peercert")
            )
        responses: asyncio.Queue[_Pending | None] = asyncio.Queue(
            self._options.max_inflight_requests
        )
        sender = asyncio.create_task(self._send(wire, responses, connection), name=f"send {peer}")
        reading = asyncio.create_task(
            self._read_requests(wire, connection, responses), name=f"read {peer}"
        )
        try:
            # A sender that stops first (the client went away, a handler failed) ends the
            # reading too, or a reader blocked on a full queue or on spent memory would hold
            # what it holds forever.
            await asyncio.wait((reading, sender), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the broker is closing; asyncio's stream callback must not see a cancel
        finally:
            if not reading.done():
                reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            try:
                responses.put_nowait(None)  # let the sender finish what was answered so far
            except asyncio.QueueFull:
                sender.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await sender
            wire.close()
            try:
                # Unsent bytes go out first, but a peer that stopped reading gets no say in
                # how long this connection (and what it holds) lives on.
                await asyncio.wait_for(wire.wait_closed(), CLOSE_GRACE_S)
            except (TimeoutError, Exception):  # noqa: BLE001 - closing regardless
                wire.abort()
            for held in list(connection.holds):
                held.release()
            if task is not None:
                self._connections.discard(task)
            metrics.CONNECTIONS.dec()

    async def _read_requests(
        self,
        wire: Wire,
        connection: Connection,
        responses: asyncio.Queue[_Pending | None],
    ) -> None:
        """Read frames and start their handlers until the client closes or sends garbage."""
        try:
            while True:
                size = await self._read_size(wire)
                if size is None:
                    return
                if connection.throttled_until:
                    await self._broker.quotas.unmuted(connection)  # KIP-219's muted channel
                held = Held(connection.budget, self._memory, connection.holds)
                # Back-pressure: read no further while this connection, or the broker as a
                # whole, holds all the memory it may.
                await held.take(size)
                # Read-only, as kio's decoder requires: a view, not a copy, of what was read.
                frame = memoryview(await wire.read_exactly(size)).toreadonly()
                response = self._dispatch(connection, frame, held)
                await responses.put(_Pending(response, held))
        except ProtocolError as exc:
            log.info("closing %s: %s", connection.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass

    async def _read_size(self, wire: Wire) -> int | None:
        """The size of the next frame, or ``None`` when the client closed between frames."""
        try:
            prefix = await wire.read_exactly(_SIZE.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise ProtocolError("connection closed inside a frame size") from exc
            return None
        (size,) = _SIZE.unpack(prefix)
        if size < 0 or size > self._options.max_request_bytes:
            raise ProtocolError(
                f"request of {size} bytes exceeds broker.max_request_bytes "
                f"({self._options.max_request_bytes})"
            )
        return int(size)

    def _dispatch(
        self, connection: Connection, frame: memoryview, held: Held
    ) -> asyncio.Task[protocol.ResponseFrame | None]:
        """Decode the request and start its handler; the task yields the response frame."""
        api_key, api_version = protocol.peek_api(frame)
        api = SUPPORTED_APIS.get(api_key)
        if api is None:
            raise ProtocolError(f"unsupported API key {api_key}")
        if not api.supports(api_version):
            if api_key == protocol.API_VERSIONS_KEY:
                return asyncio.create_task(self._unsupported_api_versions(frame))
            raise ProtocolError(f"unsupported version {api_version} of {api.name}")
        if connection.needs_login and api_key not in _BEFORE_AUTHENTICATION:
            if connection.principal is None:
                raise ProtocolError(f"{api.name} before SASL authentication")
            expires = connection.login_expires
            if expires is not None and time.monotonic() > expires:
                raise ProtocolError(f"{api.name} after the login expired, without a new one")
        request = protocol.decode_request(frame)
        context = RequestContext(self._broker, connection, request, held)
        if self._cross_zone(request.client_id):
            metrics.CROSS_ZONE_BYTES.labels("in").inc(len(frame))
        return asyncio.create_task(self._respond(api, context), name=f"{api.name} {api_version}")

    async def _respond(self, api: Api, context: RequestContext) -> protocol.ResponseFrame | None:
        request = context.request
        started = time.perf_counter()
        try:
            quotas = self._broker.quotas
            if quotas.active:
                body = await quotas.serve(context, self.handler(api))
            else:
                body = await self.handler(api)(context, request.body)
            _count_answer(api, request.api_version, body, time.perf_counter() - started)
            if body is NO_RESPONSE:
                return None
            frame = protocol.encode_response(
                request.api_key, request.api_version, request.correlation_id, body
            )
            context.held.add_response(frame.size)
            if self._cross_zone(request.client_id):
                metrics.CROSS_ZONE_BYTES.labels("out").inc(frame.size)
            return frame
        except Exception:
            # A bug, never the client's fault: handlers answer bad input with Kafka errors.
            log.exception(
                "%s v%d failed on a request from %s; closing the connection",
                api.name,
                request.api_version,
                context.connection.peer,
            )
            raise

    def _cross_zone(self, client_id: str | None) -> bool:
        """Whether the client names a zone other than this broker's (both must be known)."""
        zone = self._options.zone
        if zone is None or not client_id:
            return False
        theirs = client_zone(client_id)
        return theirs is not None and theirs != zone

    async def _unsupported_api_versions(self, frame: memoryview) -> protocol.ResponseFrame:
        from icefloe.broker.handlers.api_versions import unsupported_version_response

        return unsupported_version_response(frame)

    async def _send(
        self,
        wire: Wire,
        responses: asyncio.Queue[_Pending | None],
        connection: Connection,
    ) -> None:
        while True:
            pending = await responses.get()
            if pending is None:
                return
            try:
                frame = await pending.response
            except Exception:  # noqa: BLE001 - logged by _respond
                # A client waiting for the answer must not hang: close the connection.
                wire.close()
                return
            try:
                if frame is not None:
                    await wire.write_all(frame.parts)
                    # The last slice the socket did not take, the transport copied: let the
                    # response's buffers go now, or a slow reader's response would be held twice.
                    del frame
                    await wire.drain()
            finally:
                pending.held.release()
            if connection.doomed:
                # The client closes once it has read the answer; close only after that (or a
                # moment): a client that sees the close arrive with the answer may report the
                # close and drop the answer (kafka-python 3 did, for a failed login).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wire.wait_closed(), DOOMED_LINGER_S)
                return


def _count_answer(api: Api, version: int, body: Any, seconds: float) -> None:
    metrics.REQUEST_SECONDS.labels(api.name, str(version)).observe(seconds)
    if body is NO_RESPONSE:
        return
    for code in errors_in(body):
        metrics.REQUEST_ERRORS.labels(api.name, code.name).inc()


@dataclass(frozen=True, slots=True)
class _Pending:
    response: asyncio.Task[protocol.ResponseFrame | None]
    held: Held
    """The request's memory, released once its response is sent."""
