"""JSON Schema payloads into typed-column values: ``json`` parses, ``jsonschema`` validates.

The type mapping: ``object`` with ``properties`` → struct; ``object`` with only
``additionalProperties`` (a schema) → ``map<string, …>``; ``array`` → list; ``integer`` → long;
``number`` → double; ``boolean``; ``string`` → string (``format: date`` → ``date32``,
``format: date-time`` → ``timestamp(us, UTC)``); ``enum`` of strings → string; a type list
with ``null``, or ``oneOf``/``anyOf`` of one schema and ``{"type": "null"}`` → that type,
nullable; local ``$ref`` (``#/definitions/…``, ``#/$defs/…``) are followed. Anything else
(other unions, untyped schemas) is a string holding the value's JSON text, so no value is lost.

A payload that is not JSON, or does not validate against its schema, is a dead letter.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any, Final

import jsonschema  # type: ignore[import-untyped]
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

_SCALARS: Final[dict[str, pa.DataType]] = {
    "integer": pa.int64(),
    "number": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
}


class JsonDecoder:
    """One JSON schema, ready to validate and decode payloads."""

    def __init__(self, schema: str) -> None:
        """
        Raises:
            SchemaError: not a usable JSON schema.
        """
        try:
            self._schema = json.loads(schema)
            validator_class = jsonschema.validators.validator_for(self._schema)
            validator_class.check_schema(self._schema)
        except (ValueError, jsonschema.SchemaError, TypeError) as exc:
            raise SchemaError(f"not a usable JSON schema: {_short(exc)}") from None
        # No format checks: a format this mapping types (date, date-time) is parsed below.
        self._validator = validator_class(self._schema)
        self._budget = Budget()
        try:
            root, convert = self._type(self._schema, 0, ())
        except (KeyError, TypeError, AttributeError) as exc:
            raise SchemaError(f"not a usable JSON schema: {exc!r}") from None
        if pa.types.is_struct(root) and _is_object(self._resolve(self._schema)):
            self.arrow_type: pa.StructType = root
            self._convert = convert
        else:
            self.arrow_type = struct_of([field("value", root)])
            self._convert = lambda v, c=convert: {"value": v if c is None else c(v)}

    def decode(self, payload: bytes) -> dict[str, Any]:
        try:
            value = json.loads(payload)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise ValueError(f"does not match the schema at {where}: {_short(error)}")
        return value if self._convert is None else self._convert(value)  # type: ignore[no-any-return]

    def _resolve(self, node: Any) -> Any:
        """``node`` with a local ``$ref`` followed (once; the caller follows chains)."""
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref == "#":
                return self._schema
            if not ref.startswith("#/"):
                raise SchemaError(f"$ref {ref!r} is not local to the schema")
            target: Any = self._schema
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    raise SchemaError(f"$ref {ref!r} leads nowhere")
                target = target[part]
            return target
        return node

    def _type(self, node: Any, depth: int, stack: tuple[str, ...]) -> tuple[pa.DataType, Convert]:
        self._budget.field(depth)
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            ref = node["$ref"]
            if ref in stack:
                raise SchemaError(f"recursive $ref {ref}: a column cannot nest without end")
            return self._type(self._resolve(node), depth, (*stack, ref))
        if not isinstance(node, dict):
            return pa.string(), _json_text  # true/false schemas: any value
        for key in ("oneOf", "anyOf"):
            members = node.get(key)
            if isinstance(members, list):
                others = [m for m in members if not _is_null(m)]
                if len(others) == 1 and len(members) <= 2:
                    return self._type(others[0], depth, stack)
                return pa.string(), _json_text
        kind = node.get("type")
        if isinstance(kind, list):
            others = [k for k in kind if k != "null"]
            if len(others) != 1:
                return pa.string(), _json_text
            kind = others[0]
        if kind is None and "enum" in node:
            kind = "string" if all(isinstance(e, str) for e in node["enum"]) else None
        if kind == "object":
            properties = node.get("properties")
            extra = node.get("additionalProperties")
            if not properties and isinstance(extra, dict):
                value, convert = self._type(extra, depth + 1, stack)
                return map_of(pa.string(), value), _values(convert)
            if not isinstance(properties, dict):
                return pa.string(), _json_text
            fields, converters = [], {}
            for name, sub in properties.items():
                arrow_type, convert = self._type(sub, depth + 1, stack)
                fields.append(field(str(name), arrow_type))
                if convert is not None:
                    converters[str(name)] = convert
            return struct_of(fields), _record(converters)
        if kind == "array":
            items = node.get("items")
            if not isinstance(items, dict):
                return pa.string(), _json_text
            element, convert = self._type(items, depth + 1, stack)
            return list_of(element), None if convert is None else _each(convert)
        if kind == "string":
            fmt = node.get("format")
            if fmt == "date":
                return pa.date32(), datetime.date.fromisoformat
            if fmt == "date-time":
                return TIMESTAMP, _timestamp
            return pa.string(), None
        if kind in _SCALARS:
            return _SCALARS[
                kind
            ], _number if kind == "number" else _integer if kind == "integer" else None
        return pa.string(), _json_text


def _is_null(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "null"


def _is_object(node: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == "object" and bool(node.get("properties"))


def _json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _number(value: Any) -> float:
    return float(value)


def _integer(value: Any) -> int:
    if isinstance(value, float):  # 3.0 is an integer to JSON Schema
        return int(value)
    return int(value)


def _timestamp(text: str) -> datetime.datetime:
    value = datetime.datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError(f"date-time {text!r} has no time zone")
    return value.astimezone(datetime.UTC)


def _record(converters: dict[str, Callable[[Any], Any]]) -> Callable[[Any], Any]:
    # Properties are kept by name; others the schema allows are not columns (they stay in the
    # raw value).
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, found {type(value).__name__}")
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


def _values(convert: Convert) -> Convert:
    if convert is None:
        return None
    return lambda items: (
        None if items is None else {k: None if v is None else convert(v) for k, v in items.items()}
    )


def _short(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text if len(text) <= 200 else text[:199] + "…"
