"""A minimal Kafka client over a plain socket, for request versions and fields that the admin
clients never send (DescribeCluster for controllers, DescribeConfigs documentation, a topic
named twice in one request) and for talking to one chosen broker of a cluster.

It encodes with kio, the same schemas the broker uses, but shares no code with the broker.
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kio.index import load_payload_module
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType

_API_VERSIONS = 18


def module(api_key: int, version: int, kind: str = "request") -> Any:
    """The kio module of an API version's request (or ``"response"``) entities."""
    entity = EntityType.request if kind == "request" else EntityType.response
    return load_payload_module(api_key, version, entity)


def call(address: str, body: Any, *, client_id: str = "icefloe-tests") -> Any:
    """Send one request to the broker at ``host:port`` and return the decoded response body."""
    api_key, version = int(body.__api_key__), int(body.__version__)
    flexible = bool(body.__flexible__)
    header_type = RequestHeaderV2 if flexible else RequestHeaderV1
    frame = io.BytesIO()
    entity_writer(header_type)(
        frame,
        header_type(
            request_api_key=api_key,
            request_api_version=version,
            correlation_id=1,
            client_id=client_id,
        ),
    )
    entity_writer(type(body))(frame, body)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(frame.getvalue())) + frame.getvalue())
        (size,) = struct.unpack(">i", _read(sock, 4))
        payload = _read(sock, size)
    response_type = getattr(
        module(api_key, version, "response"), type(body).__name__[:-7] + "Response"
    )
    response_header = (
        ResponseHeaderV1 if flexible and api_key != _API_VERSIONS else ResponseHeaderV0
    )
    _, used = entity_reader(response_header)(payload, 0)
    decoded, _ = entity_reader(response_type)(payload, used)
    return decoded


def _read(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        chunks += chunk
    return bytes(chunks)
