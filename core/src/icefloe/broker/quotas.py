"""Client quota enforcement, as Kafka's brokers enforce quotas (KIP-13, KIP-124, KIP-219).

Each broker measures, per quota and per user, client id or pair the quota measures (see
:mod:`icefloe.security.quotas`), a rate over ``[quotas] window_num`` samples of
``window_size_s`` seconds (Kafka's ``Rate`` over a ``SampledStat``: 11 samples of 1 s). A
request is recorded after its handler answered it:

- **produce** (``producer_byte_rate``): the request's bytes. Over quota, the produce is still
  written and acknowledged: Kafka throttles, never refuses.
- **fetch** (``consumer_byte_rate``): the response's bytes. A fetch that would go over quota
  (or over the request quota) is answered with no records and the throttle time, and its bytes
  are taken back off the rate: the consumer asks again from the same offsets once the throttle
  time is over. As in Kafka, a fetch never asks for more than ``window_num - 1`` windows' worth
  of the quota (``max_bytes`` is lowered), or it could never pass.
- **request** (``request_percentage``): the time the request's handler held the broker's event
  loop, in percent of a window. Kafka counts the time a request holds a request-handler thread;
  an asyncio broker has one thread, the event loop, which a handler holds during each of its
  synchronous steps, between two awaits. That is what is summed: the wall time of each step,
  so waiting for the metadata store, the object store or a long poll costs nothing, while
  decoding batches, building responses and checking CRCs costs what it takes. Work a handler
  hands to a worker thread is not counted (it does not hold the loop).

Over quota, the throttle time is the time the rate needs to come back to the quota with
nothing more recorded: ``(rate - quota) / quota * window`` (Kafka's
``ClientQuotaManager.throttleTime``); for the request quota it is capped at one window, as
Kafka caps it. The response carries it in ``throttle_time_ms`` (the larger of the byte and the
request quota's), and the broker reads no further request from that connection until it has
passed (KIP-219: the response goes out at once, the connection is muted).

Nothing of this runs while no quota is set anywhere in the cluster; with quotas set, a
client no quota applies to costs one dictionary look-up per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Hashable
from typing import TYPE_CHECKING, Any, Final, cast

from kio.static.primitive import i32

from icefloe import metrics
from icefloe.config.quotas import QuotaOptions
from icefloe.security.quotas import (
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaStore,
)

if TYPE_CHECKING:
    from icefloe.broker.server import Connection, Handler, RequestContext

PRODUCE: Final = 0
FETCH: Final = 1
_EXEMPT: Final = frozenset({17, 36})
"""SaslHandshake and SaslAuthenticate: answered before the client has a principal; Kafka
handles them outside its request handlers, unthrottled."""
_MAX_THROTTLE_MS: Final = 2**31 - 1
"""``throttle_time_ms`` is an int32."""
_LONG_NAME: Final = 128
"""Names longer than this are tracked by a digest, so that tracked state stays small whatever
client id a client sends (up to 32 KiB)."""
_FETCH_PARTITION_BYTES: Final = 48
_FETCH_TOPIC_BYTES: Final = 32
"""What a fetch response's fields take per partition and per topic besides the records (and
the topic's name), for sizing it before it is encoded."""

Ident = str | bytes
"""A user or client id as tracked: itself, or a digest of a long one."""
SensorKey = tuple[str, Ident, Ident]
"""(quota key, user, client id) of one measured rate."""


class Rate:
    """Kafka's ``Rate`` over a ``SampledStat``: values summed into samples of ``window``
    seconds, a sample starting at the first value recorded after the previous one ended, and
    ``count`` of them (plus one that overlaps the measuring period's start) kept. The rate is
    the sum of the samples with a value recorded in the last ``count`` windows over the time
    they span, taken as at least ``count - 1`` whole windows, so that a client's first burst
    is spread over the whole measuring period rather than the instant it took."""

    __slots__ = ("_current", "_lasts", "_starts", "_values")

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._lasts: list[float] = []
        """When each sample last had a value recorded."""
        self._values: list[float] = []
        self._current = 0

    def record(self, value: float, now: float, count: int, window: float) -> None:
        starts = self._starts
        if not starts:
            self._add(now)
        elif now - starts[self._current] >= window:
            self._current = (self._current + 1) % (count + 1)
            if self._current >= len(starts):
                self._add(now)
            else:
                self._reset(self._current, now)
        self._values[self._current] += value
        self._lasts[self._current] = now

    def _add(self, now: float) -> None:
        self._starts.append(now)
        self._lasts.append(now)
        self._values.append(0.0)
        self._current = len(self._starts) - 1

    def _reset(self, i: int, now: float) -> None:
        self._starts[i] = self._lasts[i] = now
        self._values[i] = 0.0

    def _purge(self, now: float, count: int, window: float) -> None:
        """Samples with nothing recorded in the measuring period start afresh (at now)."""
        expired = count * window
        for i, last in enumerate(self._lasts):
            if now - last >= expired:
                self._reset(i, now)

    def window_size(self, now: float, count: int, window: float) -> float:
        """The time the rate is measured over, in seconds (Kafka's ``Rate.windowSize``)."""
        self._purge(now, count, window)
        elapsed = now - min(self._starts, default=now)
        whole = int(elapsed // window)
        if whole < count - 1:
            elapsed += (count - 1 - whole) * window
        return max(elapsed, 0.001)

    def measure(self, now: float, count: int, window: float) -> float:
        """Value per second."""
        self._purge(now, count, window)
        return sum(self._values) / self.window_size(now, count, window)


def throttle_ms(
    rate: Rate, limit: float, now: float, count: int, window: float, cap_ms: float | None = None
) -> int:
    """How long, in milliseconds, the rate needs to come back to ``limit`` if nothing more is
    recorded (0 when within it): Kafka's ``(observed - quota) / quota * window``."""
    observed = rate.measure(now, count, window)
    if observed <= limit:
        return 0
    delay = (observed - limit) / limit * rate.window_size(now, count, window) * 1000
    if cap_ms is not None:
        return int(min(delay, cap_ms))  # Kafka's boundedThrottleTime truncates
    return int(min(round(delay), _MAX_THROTTLE_MS))


def ident(name: str) -> Ident:
    """A name as tracked: long ones by a digest (a ``bytes``, so never equal to a name)."""
    if len(name) <= _LONG_NAME:
        return name
    return hashlib.blake2b(name.encode(errors="surrogatepass"), digest_size=16).digest()


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """The quotas one client (user and client id) gets, each with the rate that measures it."""

    produce: tuple[float, SensorKey] | None
    fetch: tuple[float, SensorKey] | None
    request: tuple[float, SensorKey] | None

    @property
    def any(self) -> bool:
        return self.produce is not None or self.fetch is not None or self.request is not None


_NONE: Final = Limits(None, None, None)


class _Lru(OrderedDict[Any, Any]):
    """An LRU of at most ``size`` entries."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def remember(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > self.size:
            self.popitem(last=False)


class QuotaManager:
    """Measures this broker's clients against their quotas and throttles those over."""

    def __init__(
        self,
        store: QuotaStore,
        options: QuotaOptions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._count = options.window_num
        self._window = float(options.window_size_s)
        self._clock = clock
        self._rates: _Lru = _Lru(options.max_tracked)
        self._limits: _Lru = _Lru(options.max_tracked)
        self._generation = -1

    @property
    def active(self) -> bool:
        """Whether any quota is set in the cluster; while none is, nothing is measured."""
        return self._store.configured

    @property
    def tracked(self) -> int:
        """Rates this broker tracks now (bounded by ``[quotas] max_tracked``)."""
        return len(self._rates)

    def limits(self, user: str, client_id: str) -> Limits:
        """The quotas of a client, from a cache renewed whenever the quotas change."""
        store = self._store
        if store.generation != self._generation:
            self._limits.clear()
            self._generation = store.generation
        key = (ident(user), ident(client_id))
        found: Limits | None = self._limits.get(key)
        if found is None:
            found = Limits(
                _limit(store, user, client_id, PRODUCER_BYTE_RATE),
                _limit(store, user, client_id, CONSUMER_BYTE_RATE),
                _limit(store, user, client_id, REQUEST_PERCENTAGE),
            )
            if not found.any:
                found = _NONE
            self._limits.remember(key, found)
        else:
            self._limits.move_to_end(key)
        return found

    def record(
        self, quota: tuple[float, SensorKey], value: float, now: float, cap_ms: float | None = None
    ) -> int:
        """Record ``value`` on the quota's rate; the throttle time it now needs (ms)."""
        limit, key = quota
        rate: Rate | None = self._rates.get(key)
        if rate is None:
            rate = Rate()
            self._rates.remember(key, rate)
        else:
            self._rates.move_to_end(key)
        rate.record(value, now, self._count, self._window)
        return throttle_ms(rate, limit, now, self._count, self._window, cap_ms)

    def unrecord(self, quota: tuple[float, SensorKey], value: float, now: float) -> None:
        """Take back a value recorded at ``now`` (a fetch answered without its records)."""
        rate: Rate | None = self._rates.get(quota[1])
        if rate is not None:
            rate.record(-value, now, self._count, self._window)

    async def serve(self, ctx: RequestContext, handler: Handler) -> Any:
        """Run the request's handler, record what the request used against the client's
        quotas, and throttle it if it went over: the answer carries the throttle time and the
        connection is muted for it."""
        request = ctx.request
        api_key = request.api_key
        if api_key in _EXEMPT:
            return await handler(ctx, request.body)
        limits = self.limits(quota_user(ctx.connection), request.client_id or "")
        if limits is _NONE:
            return await handler(ctx, request.body)
        body = request.body
        request_bytes = ctx.held.size
        if api_key == FETCH and limits.fetch is not None:
            body = _capped_fetch(body, limits.fetch[0] * (self._count - 1) * self._window)
        if limits.request is not None:
            timed = _Timed(handler(ctx, body))
            answer = await timed
            handler_seconds = timed.seconds
        else:
            answer = await handler(ctx, body)
            handler_seconds = 0.0
        now = self._clock()
        throttle, quota = 0, ""
        if limits.request is not None:
            throttle = self.record(
                limits.request, handler_seconds * 100, now, cap_ms=self._window * 1000
            )
            quota = "request"
        if api_key == PRODUCE and limits.produce is not None:
            produced = self.record(limits.produce, request_bytes, now)
            if produced > throttle:
                throttle, quota = produced, "produce"
        elif api_key == FETCH and _has_records(answer):
            size = 0
            if limits.fetch is not None:
                size = _fetch_response_bytes(answer)
                fetched = self.record(limits.fetch, size, now)
                if fetched > throttle:
                    throttle, quota = fetched, "fetch"
            if throttle > 0:
                # Kafka's answer to a fetch over a quota: no records (the consumer asks again),
                # and their bytes not counted.
                if limits.fetch is not None:
                    self.unrecord(limits.fetch, size, now)
                answer = dataclasses.replace(answer, responses=())
        if throttle > 0:
            self.mute(ctx.connection, throttle, quota, now)
            answer = with_throttle(answer, throttle)
        return answer

    def mute(self, connection: Connection, throttle: int, quota: str, now: float) -> None:
        """Read nothing more from the connection for ``throttle`` ms from ``now``."""
        connection.throttled_until = max(connection.throttled_until, now + throttle / 1000)
        metrics.QUOTA_THROTTLE_SECONDS.labels(quota).inc(throttle / 1000)
        metrics.QUOTA_THROTTLED_RESPONSES.labels(quota).inc()

    async def unmuted(self, connection: Connection) -> None:
        """Return once the connection's throttle time is over."""
        delay = connection.throttled_until - self._clock()
        if delay > 0:
            await asyncio.sleep(delay)
        connection.throttled_until = 0.0


def quota_user(connection: Connection) -> str:
    """The user a quota names for this connection: the SASL login, else a client certificate's
    subject, else ``ANONYMOUS`` (Kafka's principal name)."""
    if connection.principal is not None:
        return connection.principal
    certificate = connection.certificate_principal
    if certificate is not None:
        return certificate.removeprefix("User:")
    return "ANONYMOUS"


def _limit(
    store: QuotaStore, user: str, client_id: str, key: str
) -> tuple[float, SensorKey] | None:
    found = store.limit(user, client_id, key)
    if found is None:
        return None
    limit, (tag_user, tag_client) = found
    return limit, (key, ident(tag_user), ident(tag_client))


def with_throttle(answer: Any, throttle: int) -> Any:
    """The answer with ``throttle_time_ms`` set, where its version has the field."""
    if "throttle_time" not in _fields(cast(Hashable, type(answer))):
        return answer
    return dataclasses.replace(answer, throttle_time=datetime.timedelta(milliseconds=throttle))


@functools.cache
def _fields(cls: Any) -> frozenset[str]:
    if not dataclasses.is_dataclass(cls):
        return frozenset()
    return frozenset(f.name for f in dataclasses.fields(cls))


def _capped_fetch(body: Any, most: float) -> Any:
    """The fetch request asking for no more than ``most`` bytes (Kafka's
    ``getMaxValueInQuotaWindow``: more could never pass the quota)."""
    wanted = int(body.max_bytes)
    capped = max(1, min(wanted, int(most)))
    if capped >= wanted:
        return body
    return dataclasses.replace(body, max_bytes=i32(capped))


def _has_records(answer: Any) -> bool:
    return "responses" in _fields(cast(Hashable, type(answer))) and bool(answer.responses)


def _fetch_response_bytes(answer: Any) -> int:
    """A fetch response's size, as Kafka's ``FetchContext.getResponseSize`` counts it: its
    records and, roughly, the fields around them."""
    size = 16
    for topic in answer.responses:
        size += _FETCH_TOPIC_BYTES + len(getattr(topic, "topic", "") or "")
        for partition in topic.partitions:
            records = partition.records
            size += _FETCH_PARTITION_BYTES + (len(records) if records is not None else 0)
    return size


class _Timed:
    """Awaits a coroutine, adding up the wall time of each of its synchronous steps: the time
    it held the event loop."""

    __slots__ = ("_coroutine", "seconds")

    def __init__(self, coroutine: Any) -> None:
        self._coroutine = coroutine
        self.seconds = 0.0

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine = self._coroutine
        clock = time.perf_counter
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = clock()
            try:
                awaited = coroutine.send(sent) if thrown is None else coroutine.throw(thrown)
            except StopIteration as done:
                self.seconds += clock() - started
                return done.value
            except BaseException:
                self.seconds += clock() - started
                raise
            self.seconds += clock() - started
            try:
                sent, thrown = (yield awaited), None
            except BaseException as exc:  # noqa: BLE001 - handed to the coroutine, as await does
                sent, thrown = None, exc
