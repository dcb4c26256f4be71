"""Arrow types of typed columns, shared by the Avro, JSON Schema and Protobuf decoders.

What every decoder keeps to, so one Parquet file serves Iceberg and Delta (docs/tables.md):

- every field is nullable: a later schema version may drop a field, and neither format can add
  a required column to an existing table;
- integers are 64-bit and floating-point numbers double: a widening (Avro ``int`` → ``long``,
  ``float`` → ``double``) is then no change to either table, where Delta could not change a
  column's type in place at all;
- lists name their element ``element`` (the Parquet spelling both formats' name mappings use);
- timestamps are ``timestamp(us, UTC)``, the one timestamp type both formats read alike.

A schema is untrusted text: :data:`MAX_DEPTH` and :data:`MAX_FIELDS` bound the types it can
make, and a recursive type is refused (a column cannot nest without end).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Protocol

import pyarrow as pa

MAX_DEPTH: Final = 32
"""Deepest nesting of a typed column."""
MAX_FIELDS: Final = 10_000
"""Most fields (at every level together) one schema may turn into."""
TIMESTAMP: Final = pa.timestamp("us", tz="UTC")


class SchemaError(ValueError):
    """A schema that cannot become columns (its records go to the dead letters)."""


class TypeConflict(ValueError):
    """Two schemas give one field types that no table column can hold both of."""


class Decoder(Protocol):
    """One registered schema, ready to decode payloads into Python values of its type."""

    arrow_type: pa.StructType

    def decode(self, payload: bytes) -> dict[str, Any]:
        """The value of one record (after the 5-byte header); raises ``ValueError`` (or a
        subclass) for a payload that does not decode."""


class Budget:
    """Counts the fields a schema makes and how deep it nests, refusing past the limits."""

    def __init__(self) -> None:
        self.fields = 0

    def field(self, depth: int) -> None:
        self.fields += 1
        if self.fields > MAX_FIELDS:
            raise SchemaError(f"more than {MAX_FIELDS} fields")
        if depth > MAX_DEPTH:
            raise SchemaError(f"nested deeper than {MAX_DEPTH} levels")


def field(name: str, arrow_type: pa.DataType) -> pa.Field:
    return pa.field(name, arrow_type, nullable=True)


def list_of(element: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("element", element, nullable=True))


def map_of(key: pa.DataType, value: pa.DataType) -> pa.DataType:
    return pa.map_(pa.field("key", key, nullable=False), pa.field("value", value, nullable=True))


def struct_of(fields: Sequence[pa.Field]) -> pa.StructType:
    """A struct; an empty one gets no columns in Parquet, so it holds one null ``empty``."""
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise SchemaError(f"duplicate field names in {names}")
    if not fields:
        return pa.struct([field("empty", pa.bool_())])
    return pa.struct(fields)


def merge(a: pa.DataType, b: pa.DataType, path: str = "") -> pa.DataType:
    """The type holding values of both ``a`` and ``b``: structs take the union of their
    fields (``a``'s first, by name), lists and maps merge their elements; any other pair must
    be equal.

    Raises:
        TypeConflict: naming the field whose types differ.
    """
    if a == b:
        return a
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = {f.name: f for f in a}
        for f in b:
            here = f"{path}.{f.name}" if path else f.name
            if f.name in fields:
                fields[f.name] = field(f.name, merge(fields[f.name].type, f.type, here))
            else:
                fields[f.name] = f
        return pa.struct(list(fields.values()))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return list_of(merge(a.value_type, b.value_type, f"{path}[]"))
    if pa.types.is_map(a) and pa.types.is_map(b):
        key = merge(a.key_type, b.key_type, f"{path}{{key}}")
        return map_of(key, merge(a.item_type, b.item_type, f"{path}{{}}"))
    raise TypeConflict(f"field {path or '(root)'} is {a} in one schema and {b} in another")
