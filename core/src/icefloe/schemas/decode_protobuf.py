"""Protobuf payloads into typed-column values, with the protobuf runtime.

A registered Protobuf schema (``.proto`` text, or a serialized ``FileDescriptorProto``; its
imports are its references, by import path) is compiled into descriptors once per schema by
:func:`icefloe.schemas.protobuf_schema.compile_set` (protoc in a child process, with a time
limit). The record's message indexes pick the message.

The type mapping: messages → structs, ``repeated`` → lists, ``map<K, V>`` → maps, enums →
strings (the value's name, or its number as text if the schema has no name for it), 32- and
64-bit signed integers → long, ``uint64``/``fixed64`` → ``decimal128(20, 0)``, ``float``/``double``
→ double, ``bytes`` → binary, ``google.protobuf.Timestamp`` → ``timestamp(us, UTC)``, the
wrapper types (``StringValue`` …) → their nullable scalar. An unset field with presence
(a message, a proto3 ``optional``, a proto2 field) is null; other proto3 scalars have no
"unset" and read as their default.
"""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Sequence
from typing import Any, Final

import pyarrow as pa
from google.protobuf import descriptor_pool, message_factory  # type: ignore[import-untyped]
from google.protobuf.descriptor import Descriptor, FieldDescriptor  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped]

from icefloe.schemas import wire
from icefloe.schemas.arrow_types import (
    TIMESTAMP,
    Budget,
    SchemaError,
    field,
    list_of,
    map_of,
    struct_of,
)
from icefloe.schemas.formats import InvalidSchema, Referenced
from icefloe.schemas.model import RegisteredSchema
from icefloe.schemas.protobuf_schema import _add_well_known, compile_set

_WRAPPERS: Final = {
    f"google.protobuf.{name}"
    for name in [
        "DoubleValue",
        "FloatValue",
        "Int64Value",
        "UInt64Value",
        "Int32Value",
        "UInt32Value",
        "BoolValue",
        "StringValue",
        "BytesValue",
    ]
}
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_F = FieldDescriptor
_SCALARS: Final[dict[int, pa.DataType]] = {
    _F.TYPE_DOUBLE: pa.float64(),
    _F.TYPE_FLOAT: pa.float64(),
    _F.TYPE_INT64: pa.int64(),
    _F.TYPE_SINT64: pa.int64(),
    _F.TYPE_SFIXED64: pa.int64(),
    _F.TYPE_INT32: pa.int64(),
    _F.TYPE_SINT32: pa.int64(),
    _F.TYPE_SFIXED32: pa.int64(),
    _F.TYPE_UINT32: pa.int64(),
    _F.TYPE_FIXED32: pa.int64(),
    _F.TYPE_UINT64: pa.decimal128(20, 0),
    _F.TYPE_FIXED64: pa.decimal128(20, 0),
    _F.TYPE_BOOL: pa.bool_(),
    _F.TYPE_STRING: pa.string(),
    _F.TYPE_BYTES: pa.binary(),
}

ToValue = Callable[[Any], Any]


class ProtobufDecoder:
    """One Protobuf schema: the message types of its file, decoded by message indexes."""

    def __init__(
        self, schema: str, references: Sequence[tuple[str, RegisteredSchema]] = ()
    ) -> None:
        """
        Args:
            references: ``(import path, schema)`` of every file the schema imports.

        Raises:
            SchemaError: not a usable ``.proto`` file.
        """
        try:
            files, name = compile_set(schema, [Referenced(n, r) for n, r in references])
            pool = descriptor_pool.DescriptorPool()
            _add_well_known(pool)  # a fresh pool: its own copy of Google's well-known types
            for proto in files.file:
                if not proto.name.startswith("google/protobuf/"):
                    pool.Add(proto)
            self._file = pool.FindFileByName(name)
        except InvalidSchema as exc:
            raise SchemaError(str(exc)) from None
        except (TypeError, KeyError, ValueError) as exc:
            raise SchemaError(f"descriptors do not load: {exc}") from None
        if not self._file.message_types_by_name:
            raise SchemaError("the .proto file defines no message")
        self._messages: dict[tuple[int, ...], tuple[type[Message], pa.StructType, ToValue]] = {}
        # The type of the column is the first message's (what producers of one topic use):
        # records of another message of the file fit only if its fields merge with it.
        _, self.arrow_type, _ = self._message((0,))

    def decode(self, payload: bytes) -> dict[str, Any]:
        indexes, start = wire.message_indexes(payload)
        message_class, arrow_type, to_value = self._message(tuple(indexes))
        if arrow_type != self.arrow_type:
            raise ValueError(f"message {indexes} of the schema is not the topic's first message")
        message = message_class()
        try:
            message.ParseFromString(payload[start:])
        except (DecodeError, RuntimeError) as exc:
            raise ValueError(f"Protobuf payload does not decode: {exc}") from None
        return to_value(message)  # type: ignore[no-any-return]

    def _message(self, indexes: tuple[int, ...]) -> tuple[type[Message], pa.StructType, ToValue]:
        found = self._messages.get(indexes)
        if found is not None:
            return found
        descriptor: Any = self._file
        try:
            descriptor = list(self._file.message_types_by_name.values())[indexes[0]]
            for index in indexes[1:]:
                descriptor = descriptor.nested_types[index]
        except IndexError:
            raise ValueError(f"the schema has no message at indexes {list(indexes)}") from None
        if len(self._messages) >= 64:
            raise ValueError("too many message types used by one schema's records")
        arrow_type, to_value = _message_type(descriptor, 0, (), Budget())
        found = (message_factory.GetMessageClass(descriptor), arrow_type, to_value)
        self._messages[indexes] = found
        return found


def _message_type(
    descriptor: Descriptor, depth: int, stack: tuple[str, ...], budget: Budget
) -> tuple[pa.StructType, ToValue]:
    if descriptor.full_name in stack:
        raise SchemaError(
            f"recursive message {descriptor.full_name}: a column cannot nest without end"
        )
    stack = (*stack, descriptor.full_name)
    fields, converters = [], []
    for f in descriptor.fields:
        budget.field(depth + 1)
        arrow_type, convert = _field_type(f, depth + 1, stack, budget)
        fields.append(field(f.name, arrow_type))
        converters.append((f.name, f, convert))

    def to_value(message: Message) -> dict[str, Any]:
        value: dict[str, Any] = {}
        for name, fd, convert in converters:
            if fd.has_presence and not _repeated(fd) and not message.HasField(name):
                value[name] = None
            else:
                value[name] = convert(getattr(message, name))
        return value

    return struct_of(fields), to_value


def _repeated(fd: FieldDescriptor) -> bool:
    return bool(fd.is_repeated)


def _field_type(
    fd: FieldDescriptor, depth: int, stack: tuple[str, ...], budget: Budget
) -> tuple[pa.DataType, ToValue]:
    message = fd.message_type
    if message is not None and message.GetOptions().map_entry:
        key_type, key_convert = _single(message.fields_by_name["key"], depth + 1, stack, budget)
        value_type, value_convert = _single(
            message.fields_by_name["value"], depth + 1, stack, budget
        )
        return map_of(key_type, value_type), lambda m: [
            (key_convert(k), value_convert(v)) for k, v in m.items()
        ]
    element, convert = _single(fd, depth, stack, budget)
    if _repeated(fd):
        return list_of(element), lambda items: [convert(v) for v in items]
    return element, convert


def _single(
    fd: FieldDescriptor, depth: int, stack: tuple[str, ...], budget: Budget
) -> tuple[pa.DataType, ToValue]:
    message = fd.message_type
    if message is not None:
        if message.full_name == "google.protobuf.Timestamp":
            return TIMESTAMP, _timestamp
        if message.full_name in _WRAPPERS:
            inner, convert = _single(message.fields_by_name["value"], depth, stack, budget)
            return inner, lambda m: convert(m.value)
        arrow_type, to_value = _message_type(message, depth, stack, budget)
        return arrow_type, to_value
    if fd.enum_type is not None:
        names = {v.number: v.name for v in fd.enum_type.values}
        return pa.string(), lambda n: names.get(n, str(n))
    arrow_type = _SCALARS.get(fd.type)
    if arrow_type is None:
        raise SchemaError(f"field {fd.full_name} has an unsupported type {fd.type}")
    if pa.types.is_decimal(arrow_type):
        return arrow_type, decimal.Decimal
    if fd.type == _F.TYPE_FLOAT:
        return arrow_type, float
    return arrow_type, _same


def _same(value: Any) -> Any:
    return value


def _timestamp(message: Any) -> datetime.datetime:
    micros = message.seconds * 1_000_000 + message.nanos // 1000
    return _EPOCH + datetime.timedelta(microseconds=micros)
