"""The compatibility rules of each schema language, as docs/schema-registry.md lists them: each
case is a writer (old) schema, a reader (new) schema and the rule that refuses the change, or
none where the reader reads the writer's data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from icefloe.schemas.formats import incompatibilities, parse
from icefloe.schemas.model import SchemaType


def problems(schema_type: SchemaType, reader: Any, writer: Any) -> list[str]:
    def text(schema: Any) -> str:
        return schema if isinstance(schema, str) else json.dumps(schema)

    return incompatibilities(parse(schema_type, text(reader)), parse(schema_type, text(writer)))


def avro(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "R", "fields": list(fields)}


@pytest.mark.parametrize(
    ("writer", "reader", "refused"),
    [
        (avro({"name": "a", "type": "int"}), avro({"name": "a", "type": "long"}), None),
        (avro({"name": "a", "type": "long"}), avro({"name": "a", "type": "int"}), "type_mismatch"),
        (
            avro({"name": "a", "type": "int"}),
            avro({"name": "a", "type": "int"}, {"name": "b", "type": "string"}),
            "reader_field_missing_default_value",
        ),
        (
            avro({"name": "a", "type": "int"}),
            avro({"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": ""}),
            None,
        ),
        (
            avro({"name": "a", "type": "int"}, {"name": "b", "type": "int"}),
            avro({"name": "a", "type": "int"}),
            None,
        ),
    ],
)
def test_avro(writer: Any, reader: Any, refused: str | None) -> None:
    found = problems(SchemaType.AVRO, reader, writer)
    assert (refused in " ".join(found)) if refused else found == [], found


def obj(props: dict[str, Any], closed: bool = False, required: list[str] | None = None) -> Any:
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if closed:
        schema["additionalProperties"] = False
    if required:
        schema["required"] = required
    return schema


INT, NUM, STR = {"type": "integer"}, {"type": "number"}, {"type": "string"}


@pytest.mark.parametrize(
    ("writer", "reader", "refused"),
    [
        (obj({"a": INT}), obj({"a": NUM}), None),
        (obj({"a": NUM}), obj({"a": INT}), "TYPE_CHANGED"),
        (obj({"a": INT}), obj({"a": STR}), "TYPE_CHANGED"),
        (obj({"a": INT}), obj({"a": INT, "b": STR}), "PROPERTY_ADDED_TO_OPEN_CONTENT_MODEL"),
        (obj({"a": INT}, closed=True), obj({"a": INT, "b": STR}, closed=True), None),
        (
            obj({"a": INT}, closed=True),
            obj({"a": INT, "b": STR}, closed=True, required=["b"]),
            "REQUIRED_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL",
        ),
        (obj({"a": INT, "b": STR}), obj({"a": INT}), None),
        (
            obj({"a": INT, "b": STR}, closed=True),
            obj({"a": INT}, closed=True),
            "PROPERTY_REMOVED_FROM_CLOSED_CONTENT_MODEL",
        ),
        (obj({"a": INT}), obj({"a": INT}, required=["a"]), "REQUIRED_ATTRIBUTE_ADDED"),
        (obj({"a": INT}), obj({"a": INT}, closed=True), "ADDITIONAL_PROPERTIES_REMOVED"),
        ({"enum": [1, 2]}, {"enum": [1]}, "ENUM_ARRAY_NARROWED"),
        ({"enum": [1]}, {"enum": [1, 2]}, None),
        (
            {"type": "string", "maxLength": 10},
            {"type": "string", "maxLength": 5},
            "MAXLENGTH_NARROWED",
        ),
        ({"type": "string", "maxLength": 5}, {"type": "string", "maxLength": 10}, None),
        (
            {"type": "array", "items": INT},
            {"type": "array", "items": STR},
            "TYPE_CHANGED at #/items",
        ),
        ({"$ref": "a.json"}, {"$ref": "b.json"}, "REFERENCE_CHANGED"),
    ],
)
def test_json_schema(writer: Any, reader: Any, refused: str | None) -> None:
    found = problems(SchemaType.JSON, reader, writer)
    assert (refused in " ".join(found)) if refused else found == [], found


def proto(body: str, package: str = "p") -> str:
    return f'syntax = "proto3";\npackage {package};\n{body}\n'


M = "message M { string name = 1; int32 n = 2; }"


@pytest.mark.parametrize(
    ("writer", "reader", "refused"),
    [
        (proto(M), proto("message M { string name = 1; int32 n = 2; bool b = 3; }"), None),
        (proto(M), proto("message M { string name = 1; }"), None),
        (proto(M), proto("message M { string label = 1; int32 n = 2; }"), None),
        (proto(M), proto("message M { string name = 1; int64 n = 2; }"), None),
        (proto(M), proto("message M { bytes name = 1; int32 n = 2; }"), None),
        (proto(M), proto("message M { string name = 1; double n = 2; }"), "FIELD_KIND_CHANGED"),
        # A removed field's number reused with another type.
        (proto(M), proto("message M { string name = 1; string note = 2; }"), "FIELD_KIND_CHANGED"),
        (
            proto(M),
            proto("message M { string name = 1; repeated int32 n = 2; }"),
            "FIELD_LABEL_CHANGED",
        ),
        (
            proto(M),
            proto("message M { oneof o { string name = 1; int32 n = 2; } }"),
            "FIELD_MOVED_TO_ONEOF",
        ),
        (proto(M), proto(M, package="q"), "PACKAGE_CHANGED"),
        (proto(M + " message N { int32 x = 1; }"), proto(M), "MESSAGE_REMOVED"),
        (
            proto("message A { int32 x = 1; } message B { int32 x = 1; } message M { A a = 1; }"),
            proto("message A { int32 x = 1; } message B { int32 x = 1; } message M { B a = 1; }"),
            "FIELD_NAMED_TYPE_CHANGED",
        ),
        (
            proto("enum E { Z = 0; ONE = 1; } message M { E e = 1; }"),
            proto("enum E { Z = 0; } message M { E e = 1; }"),
            "ENUM_CONST_CHANGED",
        ),
        (
            proto("enum E { Z = 0; } message M { E e = 1; }"),
            proto("enum E { Z = 0; ONE = 1; } message M { E e = 1; }"),
            None,
        ),
        (
            'syntax = "proto2"; message M { optional int32 a = 1; }',
            'syntax = "proto2"; message M { optional int32 a = 1; required int32 b = 2; }',
            "REQUIRED_FIELD_ADDED",
        ),
    ],
)
def test_protobuf(writer: str, reader: str, refused: str | None) -> None:
    found = problems(SchemaType.PROTOBUF, reader, writer)
    assert (refused in " ".join(found)) if refused else found == [], found
