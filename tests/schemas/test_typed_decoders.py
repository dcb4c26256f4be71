"""The decoders behind typed columns: each schema language's type mapping, values read back
exactly, and untrusted input (bytes, schemas) turned into dead letters or refusals, never into
another exception."""

from __future__ import annotations

import datetime
import io
import json
import string
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from icefloe.schemas import columns, wire
from icefloe.schemas.arrow_types import TIMESTAMP, SchemaError, TypeConflict, list_of, map_of, merge
from icefloe.schemas.decode_avro import AvroDecoder
from icefloe.schemas.decode_json import JsonDecoder
from icefloe.schemas.model import RegisteredSchema, SchemaReference, SchemaType

# --- Avro ---------------------------------------------------------------------------------------


def avro_type(schema: Any) -> pa.DataType:
    record = {"type": "record", "name": "R", "fields": [{"name": "f", "type": schema}]}
    return AvroDecoder(json.dumps(record)).arrow_type.field("f").type


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ("int", pa.int64()),
        ("long", pa.int64()),
        ("float", pa.float64()),
        ("boolean", pa.bool_()),
        ("bytes", pa.binary()),
        ({"type": "fixed", "name": "F", "size": 4}, pa.binary()),
        ({"type": "enum", "name": "E", "symbols": ["A"]}, pa.string()),
        (["null", "string"], pa.string()),
        ({"type": "array", "items": "int"}, list_of(pa.int64())),
        ({"type": "map", "values": "string"}, map_of(pa.string(), pa.string())),
        (
            {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
            pa.decimal128(12, 3),
        ),
        ({"type": "bytes", "logicalType": "decimal", "precision": 60, "scale": 3}, pa.string()),
        ({"type": "int", "logicalType": "date"}, pa.date32()),
        ({"type": "long", "logicalType": "timestamp-millis"}, TIMESTAMP),
        ({"type": "long", "logicalType": "timestamp-micros"}, TIMESTAMP),
        ({"type": "long", "logicalType": "local-timestamp-millis"}, pa.int64()),
        ({"type": "int", "logicalType": "time-millis"}, pa.int64()),
        ({"type": "string", "logicalType": "uuid"}, pa.string()),
        (
            ["null", "string", "long"],
            pa.struct([pa.field("string", pa.string()), pa.field("long", pa.int64())]),
        ),
    ],
)
def test_avro_type_mapping(schema: Any, expected: pa.DataType) -> None:
    assert avro_type(schema) == expected


def test_a_schema_whose_root_is_not_a_record_is_a_struct_of_one_value() -> None:
    decoder = AvroDecoder('"string"')
    assert decoder.arrow_type == pa.struct([pa.field("value", pa.string())])
    assert decoder.decode(b"\x06abc") == {"value": "abc"}


@pytest.mark.parametrize(
    "schema",
    [
        "not json",
        '{"type": "record", "name": "R", "fields": 3}',
        '{"type": "nonsense"}',
        # A linked list: a column cannot nest without end.
        '{"type": "record", "name": "L", "fields": [{"name": "next", "type": ["null", "L"]}]}',
        json.dumps(
            {
                "type": "record",
                "name": "R",
                "fields": [{"name": "a", "type": "int"}, {"name": "a", "type": "int"}],
            }
        ),
        # Items of no bytes: a tiny payload could claim billions of them.
        '{"type": "array", "items": "null"}',
        '{"type": "map", "values": {"type": "record", "name": "E", "fields": []}}',
    ],
)
def test_unusable_avro_schemas_are_refused(schema: str) -> None:
    with pytest.raises(SchemaError):
        AvroDecoder(schema)


def test_a_schema_nested_too_deep_is_refused() -> None:
    schema: Any = "int"
    for i in range(40):
        schema = {"type": "record", "name": f"R{i}", "fields": [{"name": "f", "type": schema}]}
    with pytest.raises(SchemaError, match="deeper"):
        AvroDecoder(json.dumps(schema))


RECORD = {
    "type": "record",
    "name": "R",
    "fields": [
        {"name": "n", "type": "long"},
        {"name": "s", "type": ["null", "string"]},
        {"name": "xs", "type": {"type": "array", "items": "double"}},
        {"name": "m", "type": {"type": "map", "values": "boolean"}},
        {"name": "u", "type": ["null", "long", "string"]},
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}

texts = st.text(string.printable, max_size=10)
records = st.fixed_dictionaries(
    {
        "n": st.integers(-(2**63), 2**63 - 1),
        "s": st.none() | texts,
        "xs": st.lists(st.floats(allow_nan=False), max_size=4),
        "m": st.dictionaries(texts, st.booleans(), max_size=3),
        "u": st.none() | st.integers(-(2**63), 2**63 - 1) | texts,
        "t": st.datetimes(
            min_value=datetime.datetime(1900, 1, 1), max_value=datetime.datetime(2200, 1, 1)
        ).map(lambda d: d.replace(tzinfo=datetime.UTC)),
    }
)


@given(st.lists(records, max_size=5))
@settings(max_examples=50, deadline=None)
def test_avro_values_read_back_as_written(values: list[dict[str, Any]]) -> None:
    decoder = AvroDecoder(json.dumps(RECORD))
    parsed = fastavro.parse_schema(RECORD)
    decoded = []
    for value in values:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, value)
        decoded.append(decoder.decode(out.getvalue()))
    rows = pa.array(decoded, type=decoder.arrow_type).to_pylist()
    for row, value in zip(rows, values, strict=True):
        assert row["n"] == value["n"]
        assert row["s"] == value["s"]
        assert row["xs"] == value["xs"]
        assert dict(row["m"]) == value["m"]
        u = value["u"]
        assert row["u"] == (
            None
            if u is None
            else {"long": u, "string": None}
            if isinstance(u, int)
            else {"long": None, "string": u}
        )
        assert row["t"] == value["t"]


# --- the columns and dead letters ---------------------------------------------------------------


def resolved(*schemas: tuple[int, SchemaType, str]) -> dict[int, columns.Resolved]:
    return {i: columns.Resolved(RegisteredSchema(i, kind, text)) for i, kind, text in schemas}


def header(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big")


def rows_of(values: list[bytes | None]) -> pa.Table:
    return pa.table(
        {"key": pa.array([None] * len(values), pa.binary()), "value": pa.array(values, pa.binary())}
    )


@given(st.lists(st.binary(max_size=40) | st.none(), max_size=30))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_bytes_become_a_value_or_a_dead_letter(values: list[bytes | None]) -> None:
    # Hypothesis's bytes often start with 0 (the magic byte) and ids 0..2: known schemas.
    known = resolved(
        (0, SchemaType.AVRO, json.dumps(RECORD)),
        (
            1,
            SchemaType.JSON,
            json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}),
        ),
        (2, SchemaType.AVRO, '"string"'),
    )
    table, dead = columns.add_columns(rows_of(values), ["value"], known)
    errors = table.column("value_error").to_pylist()
    fields = (
        table.column("value_fields").to_pylist()
        if "value_fields" in table.column_names  # no record named a usable schema
        else [None] * len(values)
    )
    assert dead == sum(e is not None for e in errors)
    for value, error, field in zip(values, errors, fields, strict=True):
        assert (error is None) == (value is None or field is not None)


@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, 3]), st.binary(max_size=64)), max_size=20))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_payload_under_a_known_schema_is_a_value_or_a_dead_letter(
    records: list[tuple[int, bytes]],
) -> None:
    known = resolved(
        (0, SchemaType.AVRO, json.dumps(RECORD)),
        (
            1,
            SchemaType.JSON,
            json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}}),
        ),
        (2, SchemaType.AVRO, '"string"'),
        (
            3,
            SchemaType.AVRO,
            json.dumps({"type": "array", "items": {"type": "map", "values": "long"}}),
        ),
    )
    values = [header(i) + payload for i, payload in records]
    table, dead = columns.add_columns(rows_of(values), ["value"], known)
    errors = table.column("value_error").to_pylist()
    assert dead == sum(e is not None for e in errors)
    assert table.column("value_schema_id").to_pylist() == [i for i, _ in records]


def test_each_kind_of_bad_record_has_its_reason() -> None:
    text = json.dumps(RECORD)
    good = io.BytesIO()
    fastavro.schemaless_writer(
        good,
        fastavro.parse_schema(RECORD),
        {"n": 1, "s": None, "xs": [], "m": {}, "u": None, "t": 0},
    )
    json_schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}})
    values = [
        header(1) + good.getvalue(),
        b"plain",
        b"\x00\x01",
        header(9) + b"x",
        header(1) + b"\xff",
        header(2) + b'{"a": "text"}',
        header(2) + b"{not json",
        header(3) + b"x",
        None,
    ]
    table, dead = columns.add_columns(
        rows_of(values),
        ["value"],
        {
            **resolved((1, SchemaType.AVRO, text), (2, SchemaType.JSON, json_schema)),
            3: columns.Resolved(None, error="schema 3: references s version 1, which is unknown"),
        },
        {"value": [1, 2, 3]},
    )
    errors = table.column("value_error").to_pylist()
    assert errors[0] is None
    assert errors[-1] is None
    assert errors[1].startswith("not in the wire format: no magic byte")
    assert errors[2].startswith("not in the wire format")
    assert "too short" in errors[2]
    assert errors[3] == "unknown schema id 9"
    assert "Avro payload does not decode" in errors[4]
    assert "does not match the schema at a" in errors[5]
    assert "not JSON" in errors[6]
    assert "references s version 1" in errors[7]
    assert dead == 7
    assert table.column("value_schema_id").to_pylist() == [1, None, None, 9, 1, 2, 2, 3, None]


def test_records_of_schemas_that_conflict_are_dead_letters() -> None:
    first = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    second = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]}
    values = [header(1) + b"\x02", header(2) + b"\x02x"]
    table, dead = columns.add_columns(
        rows_of(values),
        ["value"],
        resolved((1, SchemaType.AVRO, json.dumps(first)), (2, SchemaType.AVRO, json.dumps(second))),
        {"value": [1, 2]},
    )
    assert table.column("value_fields").to_pylist() == [{"a": 1}, None]
    assert "does not fit the column" in table.column("value_error")[1].as_py()
    assert dead == 1


def test_the_subjects_versions_fix_the_types_whatever_records_a_file_holds() -> None:
    # A file holding only records of version 2, which changed a's type (compatibility NONE):
    # version 1 comes first, so version 2's records are dead letters in every file, and no
    # file ever gives the table a second type for a.
    first = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    second = {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": "string"}, {"name": "b", "type": "long"}],
    }
    schemas = resolved(
        (1, SchemaType.AVRO, json.dumps(first)), (2, SchemaType.AVRO, json.dumps(second))
    )
    table, dead = columns.add_columns(
        rows_of([header(2) + b"\x02x\x04"]), ["value"], schemas, {"value": [1, 2]}
    )
    assert table.schema.field("value_fields").type == pa.struct([pa.field("a", pa.int64())])
    assert dead == 1
    assert "schema 2 does not fit the column" in table.column("value_error")[0].as_py()


async def test_a_subjects_versions_are_read_in_order_past_deleted_ones() -> None:
    class Lookup:
        async def by_id(self, schema_id: int) -> RegisteredSchema | None:
            return None

        async def by_reference(self, reference: SchemaReference) -> RegisteredSchema | None:
            ids = {1: 10, 2: 11, 4: 10, 5: 12}  # version 3 deleted for good
            found = ids.get(reference.version) if reference.subject == "t-value" else None
            return RegisteredSchema(found, SchemaType.AVRO, '"string"') if found else None

    assert await columns.subject_ids("t-value", Lookup()) == [10, 11, 12]
    assert await columns.subject_ids("other-value", Lookup()) == []


def test_versions_merge_by_field_name() -> None:
    v1 = pa.struct(
        [pa.field("a", pa.int64()), pa.field("s", pa.struct([pa.field("x", pa.string())]))]
    )
    v2 = pa.struct(
        [
            pa.field("a", pa.int64()),
            pa.field("s", pa.struct([pa.field("y", pa.int64())])),
            pa.field("b", pa.string()),
        ]
    )
    assert merge(v1, v2) == pa.struct(
        [
            pa.field("a", pa.int64()),
            pa.field("s", pa.struct([pa.field("x", pa.string()), pa.field("y", pa.int64())])),
            pa.field("b", pa.string()),
        ]
    )
    with pytest.raises(TypeConflict, match=r"s\.x"):
        merge(v1, pa.struct([pa.field("s", pa.struct([pa.field("x", pa.int64())]))]))


async def test_references_are_resolved_through_the_lookup() -> None:
    address = RegisteredSchema(
        7,
        SchemaType.AVRO,
        json.dumps(
            {
                "type": "record",
                "name": "shop.Address",
                "fields": [{"name": "city", "type": "string"}],
            }
        ),
    )
    order = RegisteredSchema(
        8,
        SchemaType.AVRO,
        json.dumps(
            {
                "type": "record",
                "name": "shop.Order",
                "fields": [{"name": "to", "type": "shop.Address"}],
            }
        ),
        (SchemaReference("shop.Address", "address", 1),),
    )

    class Lookup:
        async def by_id(self, schema_id: int) -> RegisteredSchema | None:
            return {7: address, 8: order}.get(schema_id)

        async def by_reference(self, reference: SchemaReference) -> RegisteredSchema | None:
            return address if reference.subject == "address" else None

    found = await columns.resolve({8, 99}, Lookup())
    assert found[99].error == "unknown schema id 99"
    table, dead = columns.add_columns(
        rows_of([header(8) + b"\x06abc"]), ["value"], found, {"value": [8]}
    )
    assert table.column("value_fields").to_pylist() == [{"to": {"city": "abc"}}]
    assert dead == 0


# --- JSON Schema --------------------------------------------------------------------------------


def test_json_schema_type_mapping() -> None:
    schema = {
        "type": "object",
        "properties": {
            "i": {"type": "integer"},
            "n": {"type": ["number", "null"]},
            "b": {"type": "boolean"},
            "d": {"type": "string", "format": "date"},
            "t": {"type": "string", "format": "date-time"},
            "e": {"enum": ["a", "b"]},
            "l": {"type": "array", "items": {"type": "string"}},
            "m": {"type": "object", "additionalProperties": {"type": "integer"}},
            "o": {"$ref": "#/definitions/O"},
            "x": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        },
        "definitions": {"O": {"type": "object", "properties": {"z": {"type": "string"}}}},
    }
    decoder = JsonDecoder(json.dumps(schema))
    assert decoder.arrow_type == pa.struct(
        [
            pa.field("i", pa.int64()),
            pa.field("n", pa.float64()),
            pa.field("b", pa.bool_()),
            pa.field("d", pa.date32()),
            pa.field("t", TIMESTAMP),
            pa.field("e", pa.string()),
            pa.field("l", list_of(pa.string())),
            pa.field("m", map_of(pa.string(), pa.int64())),
            pa.field("o", pa.struct([pa.field("z", pa.string())])),
            pa.field("x", pa.string()),  # a union of two types: kept as its JSON text
        ]
    )
    value = decoder.decode(
        b'{"i": 1, "n": 2, "b": true, "d": "2026-01-02", "t": "2026-01-02T03:04:05+01:00",'
        b' "e": "a", "l": ["q"], "m": {"k": 3}, "o": {"z": "w"}, "x": 5}'
    )
    row = pa.array([value], decoder.arrow_type).to_pylist()[0]
    assert row["t"] == datetime.datetime(2026, 1, 2, 2, 4, 5, tzinfo=datetime.UTC)
    assert row["x"] == "5"
    assert row["n"] == 2.0
    assert row["o"] == {"z": "w"}


def test_a_recursive_json_schema_is_refused() -> None:
    schema = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    with pytest.raises(SchemaError, match="recursive"):
        JsonDecoder(json.dumps(schema))


# --- Protobuf -----------------------------------------------------------------------------------

PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
message Order {
  int32 id = 1;
  repeated string tags = 2;
  map<string, int64> counts = 3;
  Address address = 4;
  enum Kind { NEW = 0; PAID = 1; }
  Kind kind = 5;
  google.protobuf.Timestamp at = 6;
  uint64 big = 7;
  optional string note = 8;
  message Address { string city = 1; }
}
message Other { string name = 1; }
"""


def test_protobuf_type_mapping_and_values() -> None:
    from icefloe.schemas.decode_protobuf import ProtobufDecoder

    decoder = ProtobufDecoder(PROTO)
    assert decoder.arrow_type == pa.struct(
        [
            pa.field("id", pa.int64()),
            pa.field("tags", list_of(pa.string())),
            pa.field("counts", map_of(pa.string(), pa.int64())),
            pa.field("address", pa.struct([pa.field("city", pa.string())])),
            pa.field("kind", pa.string()),
            pa.field("at", TIMESTAMP),
            pa.field("big", pa.decimal128(20, 0)),
            pa.field("note", pa.string()),
        ]
    )
    message_class, _, _ = decoder._message((0,))
    message = message_class(id=3, tags=["a"], kind=1, big=2**64 - 1)
    message.counts["k"] = 4
    message.at.seconds = 60
    row = pa.array([decoder.decode(b"\x00" + message.SerializeToString())], decoder.arrow_type)
    assert row.to_pylist()[0] == {
        "id": 3,
        "tags": ["a"],
        "counts": [("k", 4)],
        "address": None,
        "kind": "PAID",
        "at": datetime.datetime(1970, 1, 1, 0, 1, tzinfo=datetime.UTC),
        "big": 2**64 - 1,
        "note": None,
    }
    with pytest.raises(ValueError, match="not the topic's first message"):
        decoder.decode(b"\x02\x02" + b"\x0a\x01x")  # indexes [1]: message Other
    with pytest.raises(ValueError, match="no message"):
        decoder.decode(b"\x02\x0e")  # indexes [7]
    with pytest.raises(ValueError, match="does not decode"):
        decoder.decode(b"\x00\xff\xff\xff")


@given(st.binary(max_size=20))
@settings(max_examples=300, deadline=None)
def test_message_indexes_of_any_bytes_parse_or_are_wire_errors(data: bytes) -> None:
    try:
        indexes, start = wire.message_indexes(data)
    except wire.WireError:
        return
    assert all(i >= 0 for i in indexes)
    assert 0 < start <= len(data)


def test_schemas_outside_the_subject_decode_only_within_its_columns() -> None:
    # Another subject naming strategy: schemas 2 and 3 are no versions of the topic's subject.
    # Letting them widen the column would give this file types another file may contradict.
    subject_version = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}
    within = {"type": "record", "name": "S", "fields": [{"name": "a", "type": "long"}]}
    wider = {
        "type": "record",
        "name": "T",
        "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "string"}],
    }
    known = resolved(
        (1, SchemaType.AVRO, json.dumps(subject_version)),
        (2, SchemaType.AVRO, json.dumps(within)),
        (3, SchemaType.AVRO, json.dumps(wider)),
    )
    values = [header(1) + b"\x02", header(2) + b"\x04", header(3) + b"\x06\x02x"]
    table, dead = columns.add_columns(rows_of(values), ["value"], known, {"value": [1]})
    assert table.column("value_fields").to_pylist() == [{"a": 1}, {"a": 2}, None]
    assert "register the schema under that subject" in table.column("value_error")[2].as_py()
    assert dead == 1
    # A subject with no versions gives no columns: every record is a dead letter.
    table, dead = columns.add_columns(rows_of(values), ["value"], known, {"value": []})
    assert "value_fields" not in table.column_names
    assert dead == 3


@pytest.mark.parametrize("head", [b"\x00\x80\x00\x00\x00", b"\x00\xff\xff\xff\xff"])
def test_a_header_naming_a_negative_schema_id_is_a_dead_letter(head: bytes) -> None:
    table, dead = columns.add_columns(rows_of([head + b"x"]), ["value"], {}, {"value": []})
    assert table.column("value_schema_id").to_pylist() == [None]
    assert "negative" in table.column("value_error")[0].as_py()
    assert dead == 1
