"""A raw Kafka connection for tests that need exact control of the bytes: kio over a socket.

Real clients hide what a test must pin down (a retried batch with the very same producer id
and sequence, a corrupt CRC, a version the broker does not serve), so these tests write the
frames themselves, with the header versions the protocol prescribes.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import io
import socket
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from kio.index import load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i64

from icefloe.broker.protocol import make
from icefloe.storage.batch import ATTRIBUTES_AT, CRC_AT, HEADER, HEADER_SIZE
from icefloe.storage.crc import crc32c
from icefloe.storage.records import Record, build_batch

_SIZE = struct.Struct(">i")
API_VERSIONS = 18


class KafkaWire:
    """One connection to a broker, sending kio request entities and reading their responses."""

    def __init__(self, address: str, *, client_id: str = "icefloe-tests", timeout: float = 30):
        host, port = address.rsplit(":", 1)
        self._socket = socket.create_connection((host, int(port)), timeout=timeout)
        self._client_id = client_id
        self._correlation = 0

    def close(self) -> None:
        self._socket.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, body: Any) -> Any:
        """Send one request and return its decoded response."""
        self.send(body)
        return self.receive(body)

    def send(self, body: Any) -> int:
        """Send a request without waiting; returns its correlation id."""
        self._correlation += 1
        self.send_frame(encode_request(body, self._correlation, self._client_id))
        return self._correlation

    def send_frame(self, frame: bytes) -> None:
        """Send bytes as they are: the test decides whether they make a valid frame."""
        self._socket.sendall(frame)

    def receive(self, request: Any) -> Any:
        """Read the next response frame and decode it as the response to ``request``."""
        frame = self.receive_frame()
        return decode_response(int(request.__api_key__), int(request.__version__), frame)

    def receive_frame(self) -> bytes:
        (size,) = _SIZE.unpack(self._read_exactly(_SIZE.size))
        return self._read_exactly(size)

    def is_closed_by_peer(self, timeout: float = 10) -> bool:
        """Whether the broker closes the connection within ``timeout`` seconds."""
        self._socket.settimeout(timeout)
        try:
            while self._socket.recv(65536):
                pass
        except ConnectionError:
            return True
        except TimeoutError:
            return False
        return True

    def _read_exactly(self, size: int) -> bytes:
        chunks = bytearray()
        while len(chunks) < size:
            chunk = self._socket.recv(size - len(chunks))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            chunks += chunk
        return bytes(chunks)


def encode_request(body: Any, correlation_id: int, client_id: str | None) -> bytes:
    """A size-prefixed request frame for a kio request entity."""
    api_key, version = int(body.__api_key__), int(body.__version__)
    header_type = RequestHeaderV2 if body.__flexible__ else RequestHeaderV1
    header = header_type(
        request_api_key=i16(api_key),
        request_api_version=i16(version),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    buffer = io.BytesIO()
    entity_writer(header_type)(buffer, header)
    entity_writer(type(body))(buffer, body)
    payload = buffer.getvalue()
    return _SIZE.pack(len(payload)) + payload


def decode_response(api_key: int, version: int, frame: bytes) -> Any:
    """Decode a response frame (without its size prefix) of ``api_key`` at ``version``."""
    header_reader, body_reader = _response_readers(api_key, version)
    _, used = header_reader(frame, 0)
    body, _ = body_reader(frame, used)
    return body


@functools.cache
def _response_readers(api_key: int, version: int) -> tuple[Any, Any]:
    schema = load_response_schema(api_key, version)
    # ApiVersions responses keep header v0 in every version, so old clients can read them.
    flexible = bool(schema.__flexible__) and api_key != API_VERSIONS
    return entity_reader(ResponseHeaderV1 if flexible else ResponseHeaderV0), entity_reader(schema)


def batch_of(
    values: Sequence[bytes],
    *,
    timestamp: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """A valid v2 record batch holding ``values`` (keyless), as a producer would send it."""
    stamp = int(time.time() * 1000) if timestamp is None else timestamp
    records = [Record(i, stamp, None, value) for i, value in enumerate(values)]
    return build_batch(
        records,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
    )


def batch_with_deltas(deltas: Sequence[tuple[int, int]], timestamp: int = 0) -> bytes:
    """A v2 batch of keyless records with the given (timestamp delta, offset delta) each, as only
    a hostile or broken producer writes them (any 64-bit deltas): its header is what produce
    validation checks (``lastOffsetDelta`` one less than the record count) and its CRC is
    right."""

    def varint(value: int) -> bytes:
        zigzag = (value << 1) ^ (value >> 63)
        out = bytearray()
        while zigzag > 0x7F:
            out.append((zigzag & 0x7F) | 0x80)
            zigzag >>= 7
        return bytes([*out, zigzag])

    records = b""
    for timestamp_delta, offset_delta in deltas:
        body = b"\0" + varint(timestamp_delta) + varint(offset_delta) + varint(-1)
        body += varint(1) + b"v" + varint(0)  # a one-byte value, no headers
        records += varint(len(body)) + body
    count = len(deltas)
    header = HEADER.pack(0, HEADER_SIZE - 12 + len(records), -1, 2, 0, 0, count - 1,
                         timestamp, timestamp, -1, -1, -1, count)  # fmt: skip
    batch = bytearray(header + records)
    struct.pack_into(">I", batch, CRC_AT, crc32c(memoryview(batch)[ATTRIBUTES_AT:]))
    return bytes(batch)


def request_module(api: str, version: int) -> Any:
    """The kio module of a request version, e.g. ``request_module("produce", 9)``."""
    return importlib.import_module(f"kio.schema.{api}.v{version}.request")


def produce_request(
    topic: str,
    partition: int,
    records: bytes | None,
    *,
    version: int = 9,
    acks: int = -1,
    transactional_id: str | None = None,
) -> Any:
    """A Produce request carrying ``records`` for one partition."""
    return produce_request_for(
        topic, {partition: records}, version=version, acks=acks, transactional_id=transactional_id
    )


def produce_request_for(
    topic: str,
    records: Mapping[int, bytes | None],
    *,
    version: int = 9,
    acks: int = -1,
    transactional_id: str | None = None,
) -> Any:
    """A Produce request carrying ``records[p]`` for each partition ``p`` of ``topic``."""
    m = request_module("produce", version)
    data = tuple(
        make(m.PartitionProduceData, index=i32(partition), records=batch)
        for partition, batch in records.items()
    )
    return make(
        m.ProduceRequest,
        transactional_id=transactional_id,
        acks=i16(acks),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(make(m.TopicProduceData, name=topic, partition_data=data),),
    )


def fetch_request(
    topic: str,
    partition: int | tuple[int, ...],
    offset: int,
    *,
    version: int = 12,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 << 20,
    partition_max_bytes: int = 1 << 20,
) -> Any:
    """A full (sessionless) Fetch request for one partition, or for several (each from
    ``offset``, in the order given)."""
    m = request_module("fetch", version)
    wanted = tuple(
        make(
            m.FetchPartition,
            partition=i32(p),
            fetch_offset=i64(offset),
            partition_max_bytes=i32(partition_max_bytes),
        )
        for p in (partition if isinstance(partition, tuple) else (partition,))
    )
    return make(
        m.FetchRequest,
        replica_id=i32(-1),
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=i32(min_bytes),
        max_bytes=i32(max_bytes),
        topics=(make(m.FetchTopic, topic=topic, partitions=wanted),),
        forgotten_topics_data=(),
    )
