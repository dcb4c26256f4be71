"""Protobuf descriptors printed back as .proto text compile to the same descriptors, and
what cannot be printed faithfully is not printed."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2

from icefloe.schemas.formats import Referenced
from icefloe.schemas.model import RegisteredSchema, SchemaType
from icefloe.schemas.protobuf_schema import compile_set, decode_serialized
from icefloe.schemas.protobuf_text import to_text

SCHEMAS = [
    """syntax = "proto3";
package shop.v1;
import "google/protobuf/timestamp.proto";
option java_package = "com.shop";
option java_multiple_files = true;
message Order {
  enum State { NEW = 0; PAID = 1; }
  message Line { string sku = 1; uint32 qty = 2; }
  int64 id = 1;
  repeated Line lines = 2;
  map<string, double> totals = 3;
  oneof payment { string card = 4; bytes token = 5; }
  optional string note = 6;
  State state = 7;
  google.protobuf.Timestamp at = 8;
  reserved 9, 11 to 13;
  reserved "old";
  sint32 delta = 14 [deprecated = true];
  repeated int32 codes = 15 [packed = false];
}
service Shop { rpc Place (Order) returns (stream Order); }
""",
    """syntax = "proto2";
message Legacy {
  required int32 a = 1;
  optional string b = 2 [default = "x\\"y"];
  optional bytes c = 3 [default = "\\001z"];
  optional Kind k = 4 [default = TWO];
  repeated float f = 5;
  enum Kind { option allow_alias = true; ONE = 1; TWO = 2; DEUX = 2; }
}
""",
]


def comparable(proto: Any) -> Any:
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(proto)
    copy.ClearField("name")
    copy.ClearField("source_code_info")

    def clear(messages: Any) -> None:
        for message in messages:
            for field in message.field:
                field.ClearField("json_name")
            clear(message.nested_type)

    clear(copy.message_type)
    return copy


def compiled(text: str, name: str = "s.proto") -> Any:
    files, main = compile_set(text)
    return next(f for f in files.file if f.name == main)


@pytest.mark.parametrize("text", SCHEMAS)
def test_printed_text_compiles_to_the_same_descriptor(text: str) -> None:
    original = compiled(text)
    printed = to_text(original)
    assert printed is not None
    assert comparable(compiled(printed)) == comparable(original), printed


def test_a_descriptor_as_the_python_serializer_sends_it_prints() -> None:
    # What confluent-kafka's ProtobufSerializer registers: a generated file's serialized_pb.
    serialized = base64.b64encode(timestamp_pb2.DESCRIPTOR.serialized_pb).decode()
    proto = decode_serialized(serialized)
    printed = to_text(proto)
    assert printed is not None
    assert "message Timestamp" in printed
    assert comparable(compiled(printed)) == comparable(proto)


def test_what_it_cannot_print_is_not_printed() -> None:
    proto = compiled('syntax = "proto2"; message A { extensions 100 to 200; }')
    assert to_text(proto) is None
    group = compiled(
        'syntax = "proto2"; message A { optional group G = 1 { optional int32 x = 2; } }'
    )
    assert to_text(group) is None


def test_a_printed_reference_compiles_with_its_importer() -> None:
    dep = compiled('syntax = "proto3"; package d; message D { string s = 1; }')
    dep_text = to_text(dep)
    assert dep_text is not None
    files, _ = compile_set(
        'syntax = "proto3"; import "d.proto"; message M { d.D d = 1; }',
        [Referenced("d.proto", RegisteredSchema(1, SchemaType.PROTOBUF, dep_text))],
    )
    assert {f.name for f in files.file} >= {"d.proto"}
