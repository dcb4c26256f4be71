"""Avro payloads into typed-column values, with fastavro.

The type mapping (docs/typed-columns.md): records → structs, arrays → lists, maps →
``map<string, …>``, enums → strings, ``[null, X]`` → a nullable X, other unions → a struct with
one field per member (the member that holds the value is set, the others null), decimals →
``decimal128``, ``date`` → ``date32``, ``timestamp-millis``/``-micros`` → ``timestamp(us,
UTC)``, ``uuid`` → string, ``fixed``/``bytes`` → binary; ``int`` is a long and ``float`` a
double (see :mod:`.arrow_types`). A schema whose root is not a record is a struct of one field,
``value``.

fastavro decodes each payload into Python values; a converter made once per schema turns only
what pyarrow does not take as is (unions of several members, UUIDs, times, local timestamps).
"""

from __future__ import annotations

import datetime
import io
import json
from collections.abc import Callable, Sequence
from typing import Any, Final

import fastavro
import pyarrow as pa

from icefloe.schemas.arrow_types import (
    TIMESTAMP,
    Budget,
    SchemaError,
    field,
    list_of,
    map_of,
    struct_of,
)

Convert = Callable[[Any], Any] | None
"""Turns a fastavro value into one pyarrow takes; ``None``: the value is taken as it is."""

_PRIMITIVES: Final[dict[str, pa.DataType]] = {
    "null": pa.null(),
    "boolean": pa.bool_(),
    "int": pa.int64(),
    "long": pa.int64(),
    "float": pa.float64(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_PYTHON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "boolean": (bool,),
    "int": (int,),
    "long": (int,),
    "float": (float,),
    "double": (float,),
    "bytes": (bytes,),
    "string": (str,),
    "array": (list,),
    "map": (dict,),
}
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class AvroDecoder:
    """One Avro schema (and the schemas it references), ready to decode payloads."""

    def __init__(self, schema: str, references: Sequence[str] = ()) -> None:
        """
        Raises:
            SchemaError: the text is not a usable Avro schema.
        """
        named: dict[str, Any] = {}
        try:
            for text in references:
                fastavro.parse_schema(json.loads(text), named_schemas=named)
            self._schema = fastavro.parse_schema(json.loads(schema), named_schemas=named)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise SchemaError(f"not a usable Avro schema: {exc}") from None
        self._named = named
        self._budget = Budget()
        self._unions = False
        """Whether a union of several members needs fastavro to name its member (which costs
        a quarter of the decoding time, so it is asked for only then)."""
        try:
            root, convert = self._type(self._schema, 0, ())
        except (KeyError, TypeError, AttributeError) as exc:  # a shape fastavro let through
            raise SchemaError(f"not a usable Avro schema: {exc!r}") from None
        if pa.types.is_struct(root) and _is_record(self._schema, named):
            self.arrow_type: pa.StructType = root
            self._convert = convert
        else:
            self.arrow_type = struct_of([field("value", root)])
            self._convert = lambda v, c=convert: {"value": v if c is None else c(v)}

    def decode(self, payload: bytes) -> dict[str, Any]:
        try:
            value = fastavro.schemaless_reader(
                io.BytesIO(payload),
                self._schema,
                None,
                return_named_type=self._unions,
                return_named_type_override=self._unions,
            )
        except (ValueError, TypeError, KeyError, IndexError, EOFError, UnicodeDecodeError) as exc:
            raise ValueError(f"Avro payload does not decode: {exc or type(exc).__name__}") from None
        result: Any = value if self._convert is None else self._convert(value)
        return result  # type: ignore[no-any-return]

    # --- schema → (arrow type, converter) -------------------------------------------------

    def _type(self, node: Any, depth: int, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert]:
        self._budget.field(depth)
        if isinstance(node, str):
            if node in _PRIMITIVES:
                return _PRIMITIVES[node], None
            if node not in self._named:
                raise SchemaError(f"unknown Avro type {node!r}")
            return self._type(self._named[node], depth, stack)
        if isinstance(node, list):
            return self._union(node, depth, stack)
        if not isinstance(node, dict):
            raise SchemaError(f"not an Avro type: {node!r}")
        logical = _logical(node)
        if logical is not None:
            return logical
        kind = node.get("type")
        if kind == "record" or kind == "error":
            name = node["name"]
            if name in stack:
                raise SchemaError(f"recursive record {name}: a column cannot nest without end")
            fields, converters = [], {}
            for f in node["fields"]:
                arrow_type, convert = self._type(f["type"], depth + 1, (*stack, name))
                fields.append(field(f["name"], arrow_type))
                if convert is not None:
                    converters[f["name"]] = convert
            return struct_of(fields), _record(converters) if converters else None
        if kind == "enum":
            return pa.string(), None
        if kind == "fixed":
            return pa.binary(), None
        if kind == "array":
            _check_items(node["items"], self._named)
            element, convert = self._type(node["items"], depth + 1, stack)
            return list_of(element), None if convert is None else _each(convert)
        if kind == "map":
            _check_items(node["values"], self._named)
            value, convert = self._type(node["values"], depth + 1, stack)
            return map_of(pa.string(), value), None if convert is None else _values(convert)
        return self._type(kind, depth, stack)  # {"type": "string"} and named references

    def _union(
        self, members: list[Any], depth: int, stack: tuple[str, ...]
    ) -> tuple[pa.DataType, Convert]:
        others = [m for m in members if m != "null"]
        if not others:
            return pa.null(), None
        if len(others) == 1:
            return self._type(others[0], depth, stack)
        self._unions = True
        fields, branches = [], []
        for member in others:
            name, kind = self._member_name(member)
            arrow_type, convert = self._type(member, depth + 1, stack)
            fields.append(field(name, arrow_type))
            branches.append((name, kind, convert))
        return struct_of(fields), _branch(branches)

    def _member_name(self, member: Any) -> tuple[str, str]:
        """A union member's field name (a named type's short name, else the type's name) and
        what tells a decoded value of it apart (the full name, or the Avro type)."""
        if isinstance(member, dict):
            if "logicalType" in member or member.get("type") in ("array", "map"):
                kind = member.get("logicalType") or member["type"]
                return str(kind).replace("-", "_"), str(member["type"])
            member = member.get("name", member.get("type"))
        text = str(member)
        if text in self._named and self._named[text].get("type") not in _PRIMITIVES:
            return text.rpartition(".")[2], text
        return text, text


def _check_items(node: Any, named: dict[str, Any]) -> None:
    """Refuse items that take no bytes (``null``, an empty record, a ``fixed`` of size 0): a
    payload of a few bytes could then claim billions of them, and decoding it would fill
    memory rather than run out of bytes."""
    if _min_bytes(node, named, 0) == 0:
        raise SchemaError("an array or map of items that take no bytes")


def _min_bytes(node: Any, named: dict[str, Any], depth: int) -> int:
    if depth > 64:
        return 1
    if isinstance(node, str):
        if node == "null":
            return 0
        return _min_bytes(named[node], named, depth + 1) if node in named else 1
    if isinstance(node, list):
        return 1  # the member index
    if isinstance(node, dict):
        kind = node.get("type")
        if kind in ("record", "error"):
            return sum(_min_bytes(f["type"], named, depth + 1) for f in node.get("fields", ()))
        if kind == "fixed":
            return int(node.get("size", 0))
        if isinstance(kind, (str, list, dict)) and kind not in ("array", "map", "enum"):
            return _min_bytes(kind, named, depth + 1)
    return 1


def _is_record(node: Any, named: dict[str, Any]) -> bool:
    if isinstance(node, str):
        node = named.get(node)
    return isinstance(node, dict) and node.get("type") in ("record", "error")


def _logical(node: dict[str, Any]) -> tuple[pa.DataType, Convert] | None:
    """The column type of a logical type fastavro decodes, or ``None`` to use the base type."""
    logical, base = node.get("logicalType"), node.get("type")
    if logical == "decimal" and base in ("bytes", "fixed"):
        precision, scale = node.get("precision"), node.get("scale", 0)
        if isinstance(precision, int) and isinstance(scale, int) and 0 <= scale <= precision <= 38:
            return pa.decimal128(max(precision, 1), scale), None
        return pa.string(), str  # beyond decimal128: kept exact as text
    if logical == "date" and base == "int":
        return pa.date32(), None
    if logical in ("timestamp-millis", "timestamp-micros") and base == "long":
        return TIMESTAMP, None
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and base == "long":
        # No time zone: kept as microseconds since the epoch (Delta has no such type by default).
        return pa.int64(), _local_micros
    if logical in ("time-millis", "time-micros"):
        return pa.int64(), _time_micros
    if logical == "uuid" and base == "string":
        return pa.string(), str
    return None


def _local_micros(value: datetime.datetime) -> int:
    return (value.replace(tzinfo=datetime.UTC) - _EPOCH) // datetime.timedelta(microseconds=1)


def _time_micros(value: datetime.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond


def _record(converters: dict[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def convert(value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is None:
            return None
        for name, fn in converters.items():
            item = value.get(name)
            if item is not None:
                value[name] = fn(item)
        return value

    return convert


def _each(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda items: (
        None if items is None else [None if v is None else convert(v) for v in items]
    )


def _values(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda items: (
        None if items is None else {k: None if v is None else convert(v) for k, v in items.items()}
    )


def _branch(branches: list[tuple[str, str, Convert]]) -> Callable[[Any], Any]:
    """A union value as a struct with its member's field set: fastavro gives named members as
    ``(full name, value)``; the others are told apart by their Python type."""

    def convert(value: Any) -> dict[str, Any] | None:
        if value is None:
            return None
        if isinstance(value, tuple) and len(value) == 2:
            kind, value = value
            matches = [b for b in branches if b[1] == kind]
        else:
            matches = [b for b in branches if _python_match(b[1], value)]
        if not matches:
            raise ValueError(f"no union member holds {type(value).__name__}")
        name, _, fn = matches[0]
        return {name: value if fn is None else fn(value)}

    return convert


def _python_match(kind: str, value: Any) -> bool:
    types = _PYTHON_TYPES.get(kind)
    if types is None:
        return False
    if kind in ("int", "long") and isinstance(value, bool):
        return False
    return isinstance(value, types)
