"""Avro schemas: parsed by the ``avro`` package, checked by its reader/writer compatibility
checker (the rules of the Avro specification's schema resolution)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import avro.compatibility
import avro.errors
import avro.name
import avro.schema

from icefloe.schemas.formats import InvalidSchema, ParsedSchema, Referenced
from icefloe.schemas.model import SchemaType


def parse(text: str, references: Sequence[Referenced] = ()) -> ParsedSchema:
    """The schema, its references' named types defined first (an Avro reference is a named
    type another subject holds)."""
    names = avro.name.Names()
    try:
        for reference in references:
            _define(reference, names)
        document = json.loads(text)
        schema = avro.schema.make_avsc_object(document, names)
    except (ValueError, TypeError, avro.errors.AvroException) as exc:
        raise InvalidSchema(f"Invalid schema: {exc}") from None
    except RecursionError:
        raise InvalidSchema("Invalid schema: nested too deeply") from None
    canonical = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
    return ParsedSchema(SchemaType.AVRO, canonical, schema)


def _define(reference: Referenced, names: avro.name.Names) -> None:
    for inner in reference.references:
        _define(inner, names)
    if reference.schema.schema_type is not SchemaType.AVRO:
        raise InvalidSchema(f"reference {reference.name!r} is not an Avro schema")
    document = json.loads(reference.schema.schema)
    fullname = _fullname(document)
    if fullname is not None and names.has_name(fullname, None):
        return  # defined by an earlier reference
    avro.schema.make_avsc_object(document, names)


def _fullname(document: object) -> str | None:
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        return None
    name: str = document["name"]
    namespace = document.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name


def incompatibilities(reader: avro.schema.Schema, writer: avro.schema.Schema) -> list[str]:
    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(reader, writer)
    if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
        return []
    found = [str(kind.value) for kind in result.incompatibilities]
    locations = sorted(result.locations)
    messages = sorted(str(m) for m in result.messages)
    return [
        f"{', '.join(found) or 'incompatible'} at {', '.join(locations) or '/'}"
        + (f": {', '.join(messages)}" if messages else "")
    ]
