"""Random but well-formed kio request entities of any API and version, for fuzzing and for
checking the frame bounds checker against kio itself.

Values are drawn from a seeded ``random.Random``, so a failing case is named by its seed.
Arrays stay short and strings ASCII, so that a sample encodes into a small frame that mutation
can then break.
"""

from __future__ import annotations

import dataclasses
import datetime
import random
import uuid
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.static.primitive import i8, i16, i32, i64, u8, u16, u32, u64

_INTS = {
    "int8": (i8, 8, True),
    "int16": (i16, 16, True),
    "int32": (i32, 32, True),
    "int64": (i64, 64, True),
    "uint8": (u8, 8, False),
    "uint16": (u16, 16, False),
    "uint32": (u32, 32, False),
    "uint64": (u64, 64, False),
}
_INTERESTING = (0, 1, -1, 2, 127, 128, 255, 32767, 65535, 1 << 20, (1 << 31) - 1, -(1 << 31))
_ERROR_CODES = list(ErrorCode)


def sample_entity(entity: type, rng: random.Random, *, names: tuple[str, ...] = ()) -> Any:
    """A random instance of a kio entity type; strings come from ``names`` now and then."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(entity):
        tagged = get_field_tag(field) is not None
        if tagged and rng.random() < 0.5:
            continue  # tagged fields are optional on the wire: leave the default
        nullable = is_optional(field) and not tagged
        values[field.name] = _sample_field(field, rng, names, nullable)
    return entity(**values)


def _sample_field(field: Any, rng: random.Random, names: tuple[str, ...], nullable: bool) -> Any:
    kind = classify_field(field)
    if isinstance(kind, EntityTupleField | PrimitiveTupleField):
        if nullable and rng.random() < 0.2:
            return None
        count = rng.choice((0, 1, 1, 2, 3))
        if isinstance(kind, EntityTupleField):
            return tuple(sample_entity(kind.type_, rng, names=names) for _ in range(count))
        kafka_type = get_schema_field_type(field)
        return tuple(_sample_primitive(kafka_type, rng, names) for _ in range(count))
    if nullable and rng.random() < 0.2:
        return None
    if isinstance(kind, EntityField):
        return sample_entity(kind.type_, rng, names=names)
    return _sample_primitive(get_schema_field_type(field), rng, names)


def _sample_primitive(kafka_type: str, rng: random.Random, names: tuple[str, ...]) -> Any:
    if kafka_type in _INTS:
        cast, bits, signed = _INTS[kafka_type]
        low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        value = rng.choice(_INTERESTING) if rng.random() < 0.5 else rng.randint(low, high)
        return cast(min(max(value, low), high))
    if kafka_type == "string":
        if names and rng.random() < 0.7:
            return rng.choice(names)
        return "".join(rng.choice("abcxyz-._09") for _ in range(rng.randint(0, 12)))
    if kafka_type in ("bytes", "records"):
        return rng.randbytes(rng.randint(0, 64))
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128)) if rng.random() < 0.8 else None
    if kafka_type == "float64":
        return rng.uniform(-1e6, 1e6)
    if kafka_type == "error_code":
        return rng.choice(_ERROR_CODES)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=rng.randint(0, 60_000))
    if kafka_type == "datetime_i64":
        return datetime.datetime.fromtimestamp(rng.randint(0, 2_000_000_000), datetime.UTC)
    raise NotImplementedError(f"no sample for Kafka type {kafka_type!r}")
