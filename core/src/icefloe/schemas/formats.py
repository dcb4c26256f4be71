"""What the registry needs of each schema language: parse a schema (with the schemas it
references) into a canonical text that identifies it, and check one schema against another.

A check answers whether a *reader* schema reads what a *writer* schema wrote, as a list of the
reasons it does not (empty: compatible). The compatibility levels choose who reads whom:
BACKWARD has the new schema read the old ones' data, FORWARD the old ones read the new one's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from icefloe.schemas.model import RegisteredSchema, SchemaType


class InvalidSchema(Exception):
    """A schema that does not parse; the message says why (answered as 42201)."""


@dataclass(frozen=True)
class ParsedSchema:
    schema_type: SchemaType
    canonical: str
    """The text that identifies the schema: equal texts are one schema, under one id."""
    parsed: Any
    """The language's own form (an Avro ``Schema``, a JSON document, a descriptor set)."""


@dataclass(frozen=True)
class Referenced:
    """A referenced schema, under the name the referencing one uses for it."""

    name: str
    schema: RegisteredSchema
    references: tuple[Referenced, ...] = ()
    """What it references in turn."""


def parse(
    schema_type: SchemaType, text: str, references: Sequence[Referenced] = ()
) -> ParsedSchema:
    """Raises InvalidSchema."""
    if schema_type is SchemaType.AVRO:
        from icefloe.schemas import avro_schema

        return avro_schema.parse(text, references)
    if schema_type is SchemaType.JSON:
        from icefloe.schemas import json_schema

        return json_schema.parse(text, references)
    from icefloe.schemas import protobuf_schema

    return protobuf_schema.parse(text, references)


def incompatibilities(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    """Why ``reader`` cannot read what ``writer`` wrote (nothing: it can)."""
    if reader.schema_type is not writer.schema_type:
        return [f"the schema type changed from {writer.schema_type} to {reader.schema_type}"]
    if reader.schema_type is SchemaType.AVRO:
        from icefloe.schemas import avro_schema

        return avro_schema.incompatibilities(reader.parsed, writer.parsed)
    if reader.schema_type is SchemaType.JSON:
        from icefloe.schemas import json_schema

        return json_schema.incompatibilities(reader.parsed, writer.parsed)
    from icefloe.schemas import protobuf_schema

    return protobuf_schema.incompatibilities(reader.parsed, writer.parsed)
