"""Bounds-check a request frame against its schema before kio decodes it.

kio's native decoder trusts length fields: for an array it reserves room for as many elements
as the length says before reading any of them, so a 5-byte varint can make it ask for hundreds
of gigabytes and the process aborts (a Rust allocation failure is not a Python exception).
This module walks the frame as the decoder will, field by field, and refuses it before kio
sees it when any length (array, string, bytes, records, tagged field) reaches past the bytes
left in the frame, or when a field that the schema declares non-nullable holds null (Apache
Kafka refuses both the same way: the request does not parse and the connection is closed).

The walk allocates nothing and reads each byte once. A run of fixed-size fields is one step,
and an array of entities made only of fixed-size fields is checked with one multiplication,
so a Produce request (whose records are one length-prefixed blob) costs a few microseconds;
``tests/bench/test_bench_wire_check.py`` measures it.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from collections.abc import Callable
from typing import Any, Final

from kio.index import load_request_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.static.protocol import Entity


class FrameError(ValueError):
    """The frame does not hold what its schema says; the message names the field."""


Step = Callable[[bytes | memoryview, int, int], int]
"""Checks one field at ``position`` within ``[position, end)``; returns the position after it."""

_FIXED_SIZES: Final = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float64": 8,
    "uuid": 16,
    "bool": 1,
    "error_code": 2,
    "timedelta_i32": 4,
    "timedelta_i64": 8,
    "datetime_i64": 8,
}
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_MAX_VARINT_BYTES: Final = 5


def check_request(frame: bytes | memoryview, api_key: int, api_version: int) -> None:
    """Check a whole request frame (header and body, without the size prefix).

    Trailing bytes after the body are allowed, as Apache Kafka allows them.

    Raises:
        FrameError: a length reaches past the frame, or a non-nullable field is null.
    """
    _request_step(api_key, api_version)(frame, 0, len(frame))


@functools.cache
def _request_step(api_key: int, api_version: int) -> Step:
    schema = load_request_schema(api_key, api_version)
    header = _entity_step(RequestHeaderV2 if schema.__flexible__ else RequestHeaderV1, False)
    body = _entity_step(schema, False)

    def check(data: bytes | memoryview, position: int, end: int) -> int:
        return body(data, header(data, position, end), end)

    return check


# --- entities ---------------------------------------------------------------------------------


@functools.cache
def _entity_step(entity: type[Entity], nullable: bool) -> Step:
    """The step for one entity (a struct), built once per type."""
    return _plan(entity).step(nullable)


@dataclasses.dataclass(frozen=True)
class _EntityPlan:
    name: str
    steps: tuple[Step, ...]
    tagged: dict[int, tuple[str, Step]]
    flexible: bool
    fixed_size: int | None
    """The entity's size when every field is fixed-size (an array of it is one check)."""

    def step(self, nullable: bool) -> Step:
        steps, tagged, flexible, name = self.steps, self.tagged, self.flexible, self.name

        def check(data: bytes | memoryview, position: int, end: int) -> int:
            if nullable:
                if position >= end:
                    raise FrameError(f"{name}: frame ends before the null marker")
                marker = data[position]
                position += 1
                if marker == 0xFF:  # -1: null
                    return position
            for step in steps:
                position = step(data, position, end)
            if flexible:
                if position < end and data[position] == 0:  # no tagged fields: the usual case
                    return position + 1
                position = _check_tags(data, position, end, tagged, name)
            return position

        return check


@functools.cache
def _plan(entity: type[Entity]) -> _EntityPlan:
    flexible = entity.__flexible__
    header = entity.__name__ == "RequestHeader"
    steps: list[Step] = []
    tagged: dict[int, tuple[str, Step]] = {}
    run_size, run_label = 0, ""  # consecutive fixed-size fields, checked as one

    def end_run() -> None:
        nonlocal run_size
        if run_size:
            steps.append(_fixed_step(run_size, run_label))
            run_size = 0

    for field in dataclasses.fields(entity):
        label = f"{entity.__name__}.{field.name}"
        tag = get_field_tag(field)
        size = _fixed_size(field)
        if tag is not None:
            # kio reads tagged fields as non-nullable, whatever the declared type.
            tagged[int(tag)] = (label, _field_step(field, label, flexible, nullable=False))
        elif size is not None:
            run_label = run_label if run_size else label
            run_size += size
        else:
            end_run()
            if header and field.name == "client_id":
                # Kafka keeps the header's client id a legacy nullable string in every version.
                steps.append(_legacy_length_step(_INT16, label, nullable=True))
            else:
                steps.append(_field_step(field, label, flexible, nullable=is_optional(field)))
    fixed_size = run_size if not steps and not flexible else None
    end_run()
    return _EntityPlan(entity.__name__, tuple(steps), tagged, flexible, fixed_size)


def _check_tags(
    data: bytes | memoryview,
    position: int,
    end: int,
    tagged: dict[int, tuple[str, Step]],
    name: str,
) -> int:
    count, position = _read_uvarint(data, position, end, name)
    for _ in range(count):
        tag, position = _read_uvarint(data, position, end, name)
        size, position = _read_uvarint(data, position, end, name)
        if size > end - position:
            raise FrameError(f"{name}: tagged field {tag} of {size} bytes runs past the frame")
        known = tagged.get(tag)
        if known is None:
            # kio refuses a tag it does not know; say so here, in the same words for every API.
            raise FrameError(f"{name}: unknown tagged field {tag}")
        label, step = known
        if step(data, position, position + size) != position + size:
            raise FrameError(f"{label}: tagged field value does not fill its declared size")
        position += size
    return position


# --- fields -----------------------------------------------------------------------------------


def _field_step(field: dataclasses.Field[Any], label: str, flexible: bool, nullable: bool) -> Step:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        return _entity_step(kind.type_, nullable)
    if isinstance(kind, EntityTupleField):
        item = _entity_step(kind.type_, False)
        return _array_step(item, _plan(kind.type_).fixed_size, label, flexible, field)
    kafka_type = get_schema_field_type(field)
    if isinstance(kind, PrimitiveTupleField):
        item = _primitive_step(kafka_type, label, flexible, nullable=False)
        return _array_step(item, _FIXED_SIZES.get(kafka_type), label, flexible, field)
    assert isinstance(kind, PrimitiveField)
    return _primitive_step(kafka_type, label, flexible, nullable)


def _fixed_size(field: dataclasses.Field[Any]) -> int | None:
    if not isinstance(classify_field(field), PrimitiveField):
        return None
    return _FIXED_SIZES.get(get_schema_field_type(field))


def _primitive_step(kafka_type: str, label: str, flexible: bool, nullable: bool) -> Step:
    size = _FIXED_SIZES.get(kafka_type)
    if size is not None:
        return _fixed_step(size, label)
    if kafka_type not in ("string", "bytes", "records"):
        raise NotImplementedError(f"{label}: no bounds check for Kafka type {kafka_type!r}")
    if flexible:
        return _compact_length_step(label, nullable)
    if kafka_type == "string":
        return _legacy_length_step(_INT16, label, nullable)
    return _legacy_length_step(_INT32, label, nullable)


def _fixed_step(size: int, label: str) -> Step:
    def check(data: bytes | memoryview, position: int, end: int) -> int:
        position += size
        if position > end:
            raise FrameError(f"{label}: frame ends inside the field")
        return position

    return check


def _legacy_length_step(prefix: struct.Struct, label: str, nullable: bool) -> Step:
    width = prefix.size

    def check(data: bytes | memoryview, position: int, end: int) -> int:
        if position + width > end:
            raise FrameError(f"{label}: frame ends inside the length")
        (length,) = prefix.unpack_from(data, position)
        position += width
        if length == -1:
            if not nullable:
                raise FrameError(f"{label}: null in a non-nullable field")
            return position
        if length < 0:
            raise FrameError(f"{label}: negative length {length}")
        position += length
        if position > end:
            raise FrameError(f"{label}: length {length} runs past the frame")
        return position

    return check


def _compact_length_step(label: str, nullable: bool) -> Step:
    def check(data: bytes | memoryview, position: int, end: int) -> int:
        if position < end and data[position] < 0x80:  # a one-byte length: the usual case
            length = data[position]
            position += 1
        else:
            length, position = _read_uvarint(data, position, end, label)
        if length == 0:
            if not nullable:
                raise FrameError(f"{label}: null in a non-nullable field")
            return position
        position += length - 1
        if position > end:
            raise FrameError(f"{label}: length {length - 1} runs past the frame")
        return position

    return check


def _array_step(
    item: Step, item_size: int | None, label: str, flexible: bool, field: dataclasses.Field[Any]
) -> Step:
    nullable = is_optional(field)
    # Every element takes at least one byte, so a count above the bytes left is a lie.
    least = item_size or 1

    def check(data: bytes | memoryview, position: int, end: int) -> int:
        if flexible:
            count, position = _read_uvarint(data, position, end, label)
            count -= 1
        else:
            if position + 4 > end:
                raise FrameError(f"{label}: frame ends inside the array length")
            (count,) = _INT32.unpack_from(data, position)
            position += 4
            if count < -1:
                raise FrameError(f"{label}: negative array length {count}")
        if count == -1:
            if not nullable:
                raise FrameError(f"{label}: null in a non-nullable array")
            return position
        if count * least > end - position:
            raise FrameError(f"{label}: {count} elements cannot fit in the frame")
        if item_size is not None:
            return position + count * item_size
        for _ in range(count):
            position = item(data, position, end)
        return position

    return check


def _read_uvarint(data: bytes | memoryview, position: int, end: int, label: str) -> tuple[int, int]:
    """An unsigned varint as kio reads it: at most five bytes."""
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if position + i >= end:
            raise FrameError(f"{label}: frame ends inside a varint")
        byte = data[position + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position + i + 1
        shift += 7
    raise FrameError(f"{label}: varint longer than {_MAX_VARINT_BYTES} bytes")
