"""What the registry and the decoders share: a registered schema, and how to look one up."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class SchemaType(enum.StrEnum):
    """The schema languages of the Confluent registry API (``schemaType``; absent means Avro)."""

    AVRO = "AVRO"
    JSON = "JSON"
    PROTOBUF = "PROTOBUF"


@dataclass(frozen=True, slots=True)
class SchemaReference:
    """A schema another one imports (a Protobuf import, an Avro named type, a JSON ``$ref``)."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """One schema under its global id: the same text under several subjects has one id."""

    id: int
    schema_type: SchemaType
    schema: str
    references: tuple[SchemaReference, ...] = ()


class SchemaLookup(Protocol):
    """Where decoders find schemas: the registry Icefloe serves, or an external one."""

    async def by_id(self, schema_id: int) -> RegisteredSchema | None:
        """The schema registered under ``schema_id``, or ``None`` if there is none."""

    async def by_reference(self, reference: SchemaReference) -> RegisteredSchema | None:
        """The schema ``reference`` names (its subject at its version), or ``None``."""
