"""JSON Schema schemas: checked against their metaschema by ``jsonschema``, and compared by a
subset of the rules Confluent documents for JSON Schema (docs/schema-registry.md lists it).

Every rule asks whether each document the writer schema accepts is accepted by the reader.
An object is *open* unless ``additionalProperties`` is ``false``: an open writer may have
written any property, so a reader may only add a property the writer declared closed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from icefloe.schemas.formats import InvalidSchema, ParsedSchema, Referenced
from icefloe.schemas.model import SchemaType

MAX_DEPTH: Final = 64


def parse(text: str, references: Sequence[Referenced] = ()) -> ParsedSchema:
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidSchema(f"Invalid schema: not JSON: {exc}") from None
    if not isinstance(document, dict | bool):
        raise InvalidSchema("Invalid schema: a JSON schema is an object or a boolean")
    try:
        import jsonschema.exceptions  # type: ignore[import-untyped, unused-ignore]
        import jsonschema.validators  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        pass  # without the schemas extra, any object is taken as a schema
    else:
        try:
            jsonschema.validators.validator_for(document).check_schema(document)
        except jsonschema.exceptions.SchemaError as exc:
            raise InvalidSchema(f"Invalid schema: {exc.message}") from None
        except RecursionError:
            raise InvalidSchema("Invalid schema: nested too deeply") from None
    canonical = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return ParsedSchema(SchemaType.JSON, canonical, document)


def incompatibilities(reader: Any, writer: Any) -> list[str]:
    found: list[str] = []
    _compare(reader, writer, "#", found, 0)
    return found


_NUMERIC: Final = {"integer", "number"}


def _types(schema: dict[str, Any]) -> set[str] | None:
    kind = schema.get("type")
    if kind is None:
        return None  # any type
    return {kind} if isinstance(kind, str) else {k for k in kind if isinstance(k, str)}


def _compare(reader: Any, writer: Any, path: str, found: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        found.append(f"{path}: nested too deeply to compare")
        return
    if reader is True or reader == {}:
        return  # accepts everything
    if writer is False:
        return  # wrote nothing
    if reader is False or writer is True or not isinstance(reader, dict):
        found.append(f"TYPE_NARROWED at {path}")
        return
    if not isinstance(writer, dict):
        return
    if reader.get("$ref") != writer.get("$ref"):
        found.append(f"REFERENCE_CHANGED at {path}")
    read_types, written_types = _types(reader), _types(writer)
    if read_types is not None:
        covered = read_types | ({"integer"} if "number" in read_types else set())
        if written_types is None or not written_types <= covered:
            found.append(
                f"TYPE_CHANGED at {path}: {sorted(written_types or ['any'])} to "
                f"{sorted(read_types)}"
            )
            return
    if "enum" in reader and not all(v in reader["enum"] for v in writer.get("enum", [None])):
        found.append(f"ENUM_ARRAY_NARROWED at {path}")
    for key, narrower in (
        ("maxLength", min),
        ("maximum", min),
        ("maxItems", min),
        ("minLength", max),
        ("minimum", max),
        ("minItems", max),
    ):
        if key in reader and (
            key not in writer or narrower(reader[key], writer[key]) != writer[key]
        ):
            found.append(f"{key.upper()}_NARROWED at {path}")
    _compare_objects(reader, writer, path, found, depth)
    if "items" in reader or "items" in writer:
        _compare(
            reader.get("items", True), writer.get("items", True), f"{path}/items", found, depth + 1
        )


def _compare_objects(
    reader: dict[str, Any], writer: dict[str, Any], path: str, found: list[str], depth: int
) -> None:
    read_props: dict[str, Any] = reader.get("properties") or {}
    written_props: dict[str, Any] = writer.get("properties") or {}
    writer_open = writer.get("additionalProperties", True) is not False
    reader_open = reader.get("additionalProperties", True) is not False
    read_required = set(reader.get("required") or ())
    written_required = set(writer.get("required") or ())
    for name, schema in read_props.items():
        where = f"{path}/properties/{name}"
        if name in written_props:
            _compare(schema, written_props[name], where, found, depth + 1)
        elif writer_open:
            found.append(f"PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL at {where}")
        elif name in read_required:
            found.append(f"REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL at {where}")
    for name in written_props:
        if name not in read_props and not reader_open:
            found.append(f"PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL at {path}/properties/{name}")
    for name in sorted(read_required - written_required):
        if name in written_props or not writer_open:
            found.append(f"REQUIRED_ATTRIBUTE_ADDED at {path}/required/{name}")
    if writer_open and not reader_open:
        found.append(f"ADDITIONAL_PROPERTIES_REMOVED at {path}")
