"""A broker's HTTP endpoints for operators: ``/metrics`` (Prometheus), ``/livez``, ``/readyz``.

They are served from a thread of their own, not from the event loop that serves Kafka: a scrape
must not slow clients down, and a broker whose loop is stuck must still answer, so that
``/livez`` can say so (it asks the loop to run a no-op and fails if that does not happen in
time). ``/readyz`` is ready when the broker is registered and its metadata and object stores
answer. Requests are served one at a time, each with a socket timeout, so an idle or flooding
peer holds at most one thread and one connection.

What is cheaper to read than to track is read per scrape, on the loop: memory in use, the
object store's request counters, and the lag of the consumer groups this broker reports (each
group by one live broker, chosen by rendezvous hashing as coordinators are).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import socket
import ssl
import threading
import time
import wsgiref.simple_server
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from prometheus_client import REGISTRY, Gauge
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric

from icefloe import metrics
from icefloe.errors import ConfigError, IcefloeError
from icefloe.ports.object_store import RequestStats

if TYPE_CHECKING:
    from icefloe.broker.broker import Broker

log = logging.getLogger(__name__)

LIVENESS_TIMEOUT_S: Final = 2.0
"""How long the event loop may take to run a no-op before ``/livez`` fails."""
PROBE_TIMEOUT_S: Final = 5.0
"""How long ``/readyz`` waits for the metadata and object stores, and a scrape for its values."""
REQUEST_TIMEOUT_S: Final = 10.0
"""A peer that sends nothing for this long is disconnected."""
_PROBE_KEY: Final = "health/probe"
"""An object that need not exist: ``head`` of it proves the store answers."""

GROUP_LAG: Final = Gauge(
    "icefloe_consumer_group_lag",
    "Records between a group's committed offset and the log end, per partition",
    ["group", "topic", "partition"],
)

Response = tuple[str, str, bytes]
"""HTTP status line, content type, body."""


class OperatorEndpoints:
    """The HTTP server of one broker's operator endpoints."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: wsgiref.simple_server.WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._remove_source: Callable[[], None] | None = None
        self._lag_labels: set[tuple[str, str, str]] = set()

    def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on ``host:port`` (0: any free port), over HTTPS with ``tls``; return the
        bound port."""
        self._loop = asyncio.get_running_loop()
        try:
            self._server = wsgiref.simple_server.make_server(
                host, port, self._app, server_class=_Server, handler_class=_QuietHandler
            )
            self._server.tls = tls
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {host}:{port}: {exc.strerror}; choose another port "
                "with --metrics-port (or [metrics] port), or set [metrics] enabled = false"
            ) from exc
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="operator-endpoints", daemon=True
        )
        self._thread.start()
        self._remove_source = metrics.add_source(self._broker_values)
        return int(self._server.server_port)

    async def close(self) -> None:
        if self._remove_source is not None:
            self._remove_source()
        for labels in self._lag_labels:
            GROUP_LAG.remove(*labels)
        self._lag_labels.clear()
        if self._server is not None:
            # shutdown() waits for serve_forever to return, which waits for a request being
            # served, which may be waiting for this loop: wait in a thread, not here.
            await asyncio.to_thread(self._server.shutdown)
            self._server.server_close()

    # --- HTTP -----------------------------------------------------------------------------

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            status, kind, body = "405 Method Not Allowed", "text/plain", b"use GET\n"
        elif path == "/metrics":
            status, kind, body = self._metrics(environ.get("HTTP_ACCEPT", ""))
        elif path == "/livez":
            status, kind, body = self._liveness()
        elif path == "/readyz":
            status, kind, body = self._readiness()
        else:
            status, kind = "404 Not Found", "text/plain"
            body = b"not found: try /metrics, /livez or /readyz\n"
        start_response(status, [("Content-Type", kind), ("Content-Length", str(len(body)))])
        return [body]

    def _metrics(self, accept: str) -> Response:
        try:
            self._on_loop(self._refresh_group_lag(), PROBE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the other metrics are still worth serving
            log.info("group lag not refreshed for this scrape: %s", exc)
        encode, kind = choose_encoder(accept)
        return "200 OK", kind, encode(REGISTRY)

    def _liveness(self) -> Response:
        started = time.monotonic()
        try:
            self._on_loop(asyncio.sleep(0), LIVENESS_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - any failure to run means not live
            return _text("503 Service Unavailable", "event loop unresponsive\n")
        return _text("200 OK", f"ok ({(time.monotonic() - started) * 1000:.1f} ms)\n")

    def _readiness(self) -> Response:
        try:
            problems = self._on_loop(self._problems(), PROBE_TIMEOUT_S + 1)
        except Exception as exc:  # noqa: BLE001 - not ready, whatever the cause
            problems = [f"readiness check failed: {type(exc).__name__}: {exc}"]
        if problems:
            return _text("503 Service Unavailable", "".join(f"{p}\n" for p in problems))
        return _text("200 OK", "ready\n")

    def _on_loop(self, coroutine: Any, timeout: float) -> Any:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise

    # --- on the event loop ----------------------------------------------------------------

    async def _problems(self) -> list[str]:
        """What keeps this broker from serving; empty when it is ready."""
        problems = []
        if self._broker.cluster.me is None:
            problems.append("not registered in the cluster yet")
        storage = self._broker.storage
        checks = {
            "metadata store": storage.metadata.get(_PROBE_KEY),
            "object store": storage.object_store.head(_PROBE_KEY),
        }
        for name, check in checks.items():
            try:
                await asyncio.wait_for(check, PROBE_TIMEOUT_S)
            except TimeoutError:
                problems.append(f"{name} did not answer within {PROBE_TIMEOUT_S:.0f} s")
            except IcefloeError as exc:
                problems.append(f"{name} unreachable: {exc}")
        return problems

    async def _refresh_group_lag(self) -> None:
        broker = self._broker
        me = broker.cluster.me
        if me is None:
            return
        storage = broker.storage
        current: set[tuple[str, str, str]] = set()
        for stored in await broker.groups.store.list():
            group_id = stored.group.group_id
            if broker.cluster.coordinator(group_id, None).node_id != me.node_id:
                continue
            for (topic_name, partition), committed in (
                await broker.groups.store.fetch_offsets(group_id)
            ).items():
                topic = await broker.topics.get(topic_name)
                if topic is None or partition >= topic.partitions:
                    continue
                stream_id = topic.streams[partition]
                log_end = storage.index.log_end_hint(stream_id)
                if log_end is None:
                    log_end = await storage.log_end(stream_id)
                labels = (group_id, topic_name, str(partition))
                GROUP_LAG.labels(*labels).set(max(0, log_end - committed.offset))
                current.add(labels)
        for labels in self._lag_labels - current:
            GROUP_LAG.remove(*labels)
        self._lag_labels = current

    # --- read per scrape, from any thread ---------------------------------------------------

    def _broker_values(self) -> Iterable[Metric]:
        memory = self._broker.memory
        used = metrics.gauge("icefloe_memory_used_bytes", "Broker memory budget in use")
        used.add_metric([], memory.used)
        limit = metrics.gauge("icefloe_memory_limit_bytes", "Broker memory budget ([broker])")
        limit.add_metric([], memory.limit)
        stats = {by: counted.snapshot() for by, counted in self._request_stats().items()}
        return [used, limit, *metrics.object_store_families(stats)]

    def _request_stats(self) -> dict[str, RequestStats]:
        stats = {"broker": self._broker.storage.object_store.stats}
        compactor = self._broker.compactor
        if compactor is not None:
            stats["compaction"] = compactor.engine.stats
        return stats


def _text(status: str, text: str) -> Response:
    return status, "text/plain; charset=utf-8", text.encode()


class _Server(wsgiref.simple_server.WSGIServer):
    tls: ssl.SSLContext | None = None

    def get_request(self) -> tuple[socket.socket, Any]:
        """The next connection, its TLS handshake done within the request timeout (a failed
        or slow handshake drops the connection: ``OSError`` is how the server skips one)."""
        connection, address = super().get_request()
        if self.tls is None:
            return connection, address
        connection.settimeout(REQUEST_TIMEOUT_S)
        try:
            return self.tls.wrap_socket(connection, server_side=True), address
        except OSError:
            connection.close()
            raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A peer that hangs up or times out is its own problem, not a traceback in the log."""
        log.debug("operator endpoint request from %s failed", client_address, exc_info=True)


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """No line per request: scrapes come every few seconds."""
