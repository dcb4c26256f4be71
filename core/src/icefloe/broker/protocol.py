"""Kafka wire protocol: frames, headers, and request/response (de)serialisation through kio.

Every request and response type comes from ``kio`` (generated from Kafka's message schemas).
Header versions follow Kafka's rules: a request header is v2 when the request version is
flexible and v1 otherwise; a response header is v1 for flexible versions and v0 otherwise,
except ApiVersions responses, which always use v0 so that a client can read them before it
knows which versions the broker supports.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import struct
from collections.abc import Hashable, Sequence
from typing import Any, Final, TypeVar, cast

from kio.index import load_payload_module, load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.primitive import i32

from icefloe.broker.wire_check import check_request
from icefloe.errors import IcefloeError

API_VERSIONS_KEY: Final = 18
_API_PREFIX = struct.Struct(">hh")
_SIZE = struct.Struct(">i")

T = TypeVar("T")


class ProtocolError(IcefloeError):
    """The frame cannot be understood; the connection must be closed (Kafka has no error code
    for a request it cannot parse)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    """The kio request payload, e.g. ``ProduceRequest``."""


def peek_api(frame: bytes | memoryview) -> tuple[int, int]:
    """(api key, api version) of a request frame, without decoding the rest."""
    if len(frame) < _API_PREFIX.size:
        raise ProtocolError("request shorter than its header")
    api_key, api_version = _API_PREFIX.unpack_from(frame)
    return api_key, api_version


@functools.cache
def _request_reader(api_key: int, api_version: int) -> tuple[Any, Any, bool]:
    schema = load_request_schema(api_key, api_version)
    flexible = bool(schema.__flexible__)
    header = RequestHeaderV2 if flexible else RequestHeaderV1
    return entity_reader(header), entity_reader(schema), flexible


def decode_request(frame: bytes | memoryview) -> Request:
    """Decode a whole request frame (without its size prefix).

    The caller must have checked, with :func:`peek_api`, that the version is supported.

    Raises:
        ProtocolError: the bytes do not decode as that request.
    """
    api_key, api_version = peek_api(frame)
    header_reader, body_reader, _ = _request_reader(api_key, api_version)
    try:
        # kio's decoder aborts the process on a length it cannot allocate: check them first.
        check_request(frame, api_key, api_version)
        header, used = header_reader(frame, 0)
        # Trailing bytes are ignored, as Apache Kafka's broker ignores them: some clients send
        # them (librdkafka's Metadata v12 request for all topics carries three).
        body, _ = body_reader(frame, used)
    except Exception as exc:
        raise ProtocolError(f"malformed request (api {api_key} v{api_version}): {exc}") from exc
    return Request(api_key, api_version, int(header.correlation_id), header.client_id, body)


@functools.cache
def _response_writer(api_key: int, api_version: int) -> tuple[Any, Any, Any]:
    schema = load_response_schema(api_key, api_version)
    flexible = bool(schema.__flexible__) and api_key != API_VERSIONS_KEY
    header = ResponseHeaderV1 if flexible else ResponseHeaderV0
    return header, entity_writer(header), entity_writer(schema)


Buffer = bytes | bytearray | memoryview


class ResponseFrame:
    """A size-prefixed response frame, as the pieces it was written in.

    kio writes a response field by field. Small fields are gathered into shared buffers, but a
    fetch response's records (up to megabytes per partition) are kept as references to the
    handler's buffers: the frame is not one more copy of them, and the transport sends them
    from where they are.
    """

    __slots__ = ("_tail", "parts", "size")

    def __init__(self) -> None:
        self._tail = bytearray(_SIZE.size)  # the size prefix, set by finish()
        self.parts: list[Buffer] = [self._tail]
        self.size = _SIZE.size
        """Bytes in the frame, its size prefix included."""

    def write(self, data: Buffer | RecordParts) -> int:
        if isinstance(data, RecordParts):
            for part in data.parts:
                self.write(part)
            return data.size
        size = len(data)
        if size >= BY_REFERENCE:
            self.parts.append(data)
            self._tail = bytearray()
            self.parts.append(self._tail)
        else:
            self._tail += data
        self.size += size
        return size

    def finish(self) -> ResponseFrame:
        _SIZE.pack_into(self.parts[0], 0, self.size - _SIZE.size)
        self.parts = [part for part in self.parts if part]
        return self


class RecordParts:
    """A records field given as the buffers its batches lie in (a fetch of one partition
    spans several WAL objects). kio writes its length, then hands it whole to
    :meth:`ResponseFrame.write`, which takes the parts in turn: they are never joined."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: Sequence[Buffer]) -> None:
        self.parts = tuple(parts)
        self.size = sum(len(part) for part in self.parts)

    def __len__(self) -> int:
        return self.size

    @staticmethod
    def of(parts: Sequence[Buffer]) -> Buffer | RecordParts:
        """The value of a records field holding ``parts``, in order."""
        if not parts:
            return b""
        return parts[0] if len(parts) == 1 else RecordParts(parts)


BY_REFERENCE: Final = 16 * 1024
"""Writes at least this large go into a :class:`ResponseFrame` by reference, not copied.

Well under a full batch of the Java producer (64 KiB by default, a little less as sent): a
fetch from the WAL is mostly such chunks, and copying them into a growing buffer cost more
than the transport's writes of them one by one. Smaller ones are gathered, as one write of
many small pieces is cheaper than a write each."""


def encode_response(
    api_key: int, api_version: int, correlation_id: int, body: Any
) -> ResponseFrame:
    """A size-prefixed response frame (large fields by reference: see :class:`ResponseFrame`).
    The buffers ``body`` holds must not change until the frame is sent."""
    header_type, write_header, write_body = _response_writer(api_key, api_version)
    frame = ResponseFrame()
    write_header(frame, header_type(correlation_id=i32(correlation_id)))
    write_body(frame, body)
    return frame.finish()


@functools.cache
def response_module(api_key: int, api_version: int) -> Any:
    """The kio module holding a response version's entity classes (nested ones included)."""
    return load_payload_module(api_key, api_version, EntityType.response)


@functools.cache
def _field_names(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


@functools.cache
def _versions_of(cls: Any) -> tuple[str, str, list[str]]:
    """The package of the versions of the entity ``cls`` is one version of, the module name
    within each version (``response``), and the versions (``v0``, ``v1``, …) oldest first.

    kio keeps each version in a module of its own (``kio.schema.fetch.v12.response``); the
    same entity of another version has the same class name in its sibling module.
    """
    versions_package, _, kind = cls.__module__.rsplit(".", 2)
    package = importlib.import_module(versions_package)
    versions = [module.name for module in pkgutil.iter_modules(package.__path__)]
    return versions_package, kind, sorted(versions, key=lambda name: int(name.removeprefix("v")))


def _field_names_in(cls: Any, versions: list[str]) -> frozenset[str]:
    versions_package, kind, _ = _versions_of(cls)
    names: set[str] = set()
    for version in versions:
        module = importlib.import_module(f"{versions_package}.{version}.{kind}")
        entity = getattr(module, cls.__name__, None)
        if entity is not None:
            names |= _field_names(entity)
    return frozenset(names)


@functools.cache
def _field_names_in_any_version(cls: Any) -> frozenset[str]:
    """The fields of every version of the entity ``cls`` is one version of."""
    return _field_names_in(cls, _versions_of(cls)[2])


@functools.cache
def _field_names_at_either_end(cls: Any) -> frozenset[str]:
    """The fields of the oldest and the newest version of the entity ``cls`` is one version of.

    A value a handler passes that its version lacks is nearly always a field that newer
    versions added or that they dropped: two imports tell, where every version's would cost
    a tenth of a second on a broker's first request of the API (kio builds each module's
    classes as it imports them).
    """
    versions = _versions_of(cls)[2]
    return _field_names_in(cls, [versions[0], versions[-1]])


def make(cls: type[T], **values: Any) -> T:
    """Build a kio entity, ignoring values for fields this version does not have.

    Handlers serve many versions of an API with one piece of code: they pass every value any
    version needs, and each version's class takes the ones it declares. A name that no version
    declares is a mistake, not a field of another version.

    Raises:
        TypeError: a value names a field that no version of the entity has.
    """
    names = _field_names(cast(Hashable, cls))
    unknown = values.keys() - names
    if unknown and not unknown <= _field_names_at_either_end(cast(Hashable, cls)):
        misspelled = unknown - _field_names_in_any_version(cast(Hashable, cls))
        if misspelled:
            raise TypeError(f"{cls.__name__} has no field {sorted(misspelled)} in any version")
    return cls(**{k: v for k, v in values.items() if k in names})
