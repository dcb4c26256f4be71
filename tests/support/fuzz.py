"""A network fuzzer for Kafka brokers: mutated frames of every advertised API, sent at speed
over several connections, while a bystander connection measures how long its own requests take.

Frames come from a seeded ``random.Random``, so a run is repeatable. Each frame is one of:
a well-formed request of an advertised API and version (random values, names from a given
list) left as it is or mutated (bit flips, interesting bytes, lying lengths, truncation, junk
appended, a wrong size prefix); a request of an unknown API key or unsupported version; a
Produce whose record batch is valid or corrupted; or noise.

Used by ``tests/integration/test_fuzz.py`` (seconds, in the suite) and by
``tests/fuzz_broker.py`` (long runs, by hand).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import ssl
import statistics
import struct
import time
from collections.abc import Iterator

from kio.index import load_request_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic

from icefloe.broker.apis import SUPPORTED_APIS
from icefloe.storage.records import Record, build_batch
from tests.support.kafka_samples import sample_entity
from tests.support.kafka_wire import encode_request, produce_request

_SIZE = struct.Struct(">i")
_LIES = (
    b"\xff\xff\xff\xff\x0f",  # the largest 5-byte varint
    b"\x80\x80\x80\x80\x80\x01",  # a varint longer than five bytes
    b"\x7f\xff\xff\xff",  # int32 max
    b"\xff\xff\xff\xfe",  # int32 -2
    b"\x7f\xff",  # int16 max
    b"\x00",
    b"\xff",
)
_INTERESTING_BYTES = (0x00, 0x01, 0x7F, 0x80, 0xFF, 0xFE)
ADVERTISED = [
    (api.key, version)
    for api in SUPPORTED_APIS.values()
    for version in range(api.min_version, api.max_version + 1)
]


class FrameSource:
    """An endless, repeatable stream of hostile frames (each with its size prefix)."""

    def __init__(self, seed: int, names: tuple[str, ...], produce_topics: tuple[str, ...]):
        self._rng = random.Random(seed)
        self._names = names
        self._produce_topics = produce_topics
        self._correlation = 0

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        rng = self._rng
        self._correlation += 1
        roll = rng.random()
        if roll < 0.70:
            payload = self._sample()
            if rng.random() < 0.75:
                payload = self._mutate(payload)
        elif roll < 0.85:
            payload = self._produce()
        elif roll < 0.92:
            payload = self._unsupported()
        else:
            payload = rng.randbytes(rng.randint(0, 200))
        return self._prefix(payload)

    def _sample(self) -> bytes:
        api_key, version = self._rng.choice(ADVERTISED)
        body = sample_entity(load_request_schema(api_key, version), self._rng, names=self._names)
        return encode_request(body, self._correlation, "fuzz")[4:]

    def _produce(self) -> bytes:
        rng = self._rng
        records = [
            Record(i, int(time.time() * 1000), rng.randbytes(4), rng.randbytes(rng.randint(0, 300)))
            for i in range(rng.randint(1, 5))
        ]
        batch = bytearray(build_batch(records))
        if rng.random() < 0.6:
            batch = self._mutate(batch, start=0)
        topic = rng.choice(self._produce_topics)
        body = produce_request(topic, rng.randint(0, 2), bytes(batch), version=rng.randint(3, 11))
        return encode_request(body, self._correlation, "fuzz")[4:]

    def _unsupported(self) -> bytes:
        rng = self._rng
        api_key = rng.choice((rng.randint(-5, 200), rng.choice(list(SUPPORTED_APIS))))
        version = rng.choice((-1, 0, 99, rng.randint(-32768, 32767)))
        header = struct.pack(">hhih", api_key, version, self._correlation, 4) + b"fuzz"
        return header + rng.randbytes(rng.randint(0, 64))

    def _mutate(self, payload: bytes | bytearray, start: int = 4) -> bytearray:
        """One to three mutations, anywhere after ``start`` (by default: after API and version)."""
        rng = self._rng
        data = bytearray(payload)
        for _ in range(rng.randint(1, 3)):
            if len(data) <= start:
                data += rng.randbytes(8)
            position = rng.randrange(start, len(data))
            kind = rng.randrange(6)
            if kind == 0:
                data[position] ^= 1 << rng.randrange(8)
            elif kind == 1:
                data[position] = rng.choice(_INTERESTING_BYTES)
            elif kind == 2:
                lie = rng.choice(_LIES)
                data[position : position + len(lie)] = lie
            elif kind == 3:
                del data[position:]
            elif kind == 4:
                data += rng.randbytes(rng.randint(1, 32))
            else:
                end = min(len(data), position + rng.randint(1, 16))
                data[position:position] = data[position:end]
        return data

    def _prefix(self, payload: bytes | bytearray) -> bytes:
        size = len(payload)
        if self._rng.random() < 0.03:
            size += self._rng.choice((-3, -1, 1, 5, 1 << 20, -(1 << 30)))
        return _SIZE.pack(size) + bytes(payload)


@dataclasses.dataclass
class FuzzReport:
    sent: int = 0
    """Frames written to a socket."""
    answered: int = 0
    """Responses received."""
    refused: int = 0
    """Connections the broker closed (each after a frame it would not take)."""
    bystander_latencies: list[float] = dataclasses.field(default_factory=list)
    bystander_failures: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: FuzzReport) -> None:
        self.sent += other.sent
        self.answered += other.answered
        self.refused += other.refused
        self.bystander_latencies += other.bystander_latencies
        self.bystander_failures += other.bystander_failures

    @property
    def handled(self) -> int:
        """Frames the broker certainly handled: answered, or refused by closing."""
        return self.answered + self.refused

    @property
    def bystander_max_s(self) -> float:
        return max(self.bystander_latencies, default=0.0)

    @property
    def bystander_p99_s(self) -> float:
        if len(self.bystander_latencies) < 2:
            return self.bystander_max_s
        return statistics.quantiles(self.bystander_latencies, n=100)[98]


async def fuzz(
    host: str,
    port: int,
    frames: Iterator[bytes],
    *,
    count: int,
    connections: int = 8,
    window: int = 8,
    bystander_topic: str | None = None,
    bystander_interval_s: float = 0.05,
    attack_port: int | None = None,
    attack_tls: ssl.SSLContext | None = None,
) -> FuzzReport:
    """Send ``count`` frames over ``connections`` connections while a bystander measures.

    Each connection keeps at most ``window`` frames unanswered, so that few frames are lost
    in the socket behind one that makes the broker close the connection. The bystander uses
    ``port``; the attackers ``attack_port`` (another listener) if given, over TLS with
    ``attack_tls``.
    """
    target = (host, attack_port or port, attack_tls)
    report = FuzzReport()
    remaining = [count]
    stop = asyncio.Event()
    bystander = asyncio.create_task(
        _bystander(host, port, bystander_topic, bystander_interval_s, report, stop)
    )
    try:
        await asyncio.gather(
            *(_attacker(target, frames, remaining, window, report) for _ in range(connections))
        )
    finally:
        stop.set()
        await bystander
    return report


@dataclasses.dataclass
class _Responses:
    """What came back on one attacking connection."""

    count: int = 0
    closed: bool = False
    arrived: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


async def _attacker(
    target: tuple[str, int, ssl.SSLContext | None],
    frames: Iterator[bytes],
    remaining: list[int],
    window: int,
    report: FuzzReport,
) -> None:
    host, port, tls = target
    while remaining[0] > 0:
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        except (ConnectionError, ssl.SSLError):
            report.refused += 1  # the broker hung up during the TLS handshake
            continue
        responses = _Responses()
        counting = asyncio.create_task(_count_responses(reader, responses))
        sent = 0
        try:
            while remaining[0] > 0 and not responses.closed:
                if sent - responses.count >= window:
                    responses.arrived.clear()
                    # Long polls and acks=0 produces keep frames unanswered: after a while,
                    # start over on a new connection rather than wait.
                    await asyncio.wait_for(responses.arrived.wait(), 2)
                    continue
                remaining[0] -= 1
                sent += 1
                report.sent += 1
                writer.write(next(frames))
                await asyncio.wait_for(writer.drain(), 10)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            counting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await counting
            report.answered += responses.count
            report.refused += responses.closed


async def _count_responses(reader: asyncio.StreamReader, responses: _Responses) -> None:
    try:
        while True:
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            await reader.readexactly(size)
            responses.count += 1
            responses.arrived.set()
    except (ConnectionError, asyncio.IncompleteReadError):
        responses.closed = True
        responses.arrived.set()


async def _bystander(
    host: str,
    port: int,
    topic: str | None,
    interval: float,
    report: FuzzReport,
    stop: asyncio.Event,
) -> None:
    """A well-behaved client on its own connection: one request at a time, timed."""
    reader, writer = await asyncio.open_connection(host, port)
    correlation = 0
    try:
        while not stop.is_set():
            correlation += 1
            if topic is not None and correlation % 2:
                body: object = MetadataRequest(
                    topics=(MetadataRequestTopic(topic_id=None, name=topic),),
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                )
            else:
                body = ApiVersionsRequest(client_software_name="b", client_software_version="1")
            frame = encode_request(body, correlation, "bystander")
            started = time.monotonic()
            try:
                writer.write(frame)
                await writer.drain()
                (size,) = _SIZE.unpack(await asyncio.wait_for(reader.readexactly(4), 30))
                answer = await asyncio.wait_for(reader.readexactly(size), 30)
            except (ConnectionError, TimeoutError, asyncio.IncompleteReadError) as exc:
                report.bystander_failures.append(f"request {correlation}: {exc!r}")
                return
            report.bystander_latencies.append(time.monotonic() - started)
            if struct.unpack_from(">i", answer)[0] != correlation:
                report.bystander_failures.append(f"request {correlation}: wrong correlation id")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
