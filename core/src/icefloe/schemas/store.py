"""The schema registry's keys in the metadata store (the prefix is in :mod:`icefloe.keyspace`).

Every broker reads and writes the same keys, so any broker serves the registry. Ids and
versions are claimed by compare-and-set, never by a leader:

- a schema's id comes from the ``schema-id`` counter; the schema is written under
  ``ids/<id>`` first, then its fingerprint claims the id with ``MUST_NOT_EXIST``. Two brokers
  registering one schema at once both write a record, one fingerprint wins and the loser
  takes the winner's id (its own record, never handed out, is deleted). So one schema never
  has two ids, and the counter never gives one id twice.
- a subject's next version is written with ``MUST_NOT_EXIST``; a loser reads the subject again.

Records under ``ids/`` never change once written and are never deleted (a permanent delete
removes a subject's version, not the schema), so readers cache them by id for good and records
written with an id stay decodable.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Final

import msgpack

from icefloe.errors import ConflictError
from icefloe.keyspace import SCHEMA_REGISTRY, prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore
from icefloe.schemas.model import RegisteredSchema, SchemaReference, SchemaType
from icefloe.storage import counters

ID_COUNTER: Final = "schema-id"
MAX_ID: Final = 2**31 - 1
"""Ids and versions are Java ints in the Confluent API."""
_IDS: Final = SCHEMA_REGISTRY + "ids/"
_FINGERPRINTS: Final = SCHEMA_REGISTRY + "fingerprints/"
_SUBJECTS: Final = SCHEMA_REGISTRY + "subjects/"
_REFERENCED: Final = SCHEMA_REGISTRY + "referenced/"
_CONFIG: Final = SCHEMA_REGISTRY + "config/"
_MODE: Final = SCHEMA_REGISTRY + "mode/"
_GLOBAL_CONFIG: Final = SCHEMA_REGISTRY + "global-config"
_GLOBAL_MODE: Final = SCHEMA_REGISTRY + "global-mode"


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a subject."""

    subject: str
    version: int
    schema_id: int
    deleted: bool
    record_version: int
    """The metadata record's version, for compare-and-set."""


def _subject(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


def _id_key(schema_id: int) -> str:
    return f"{_IDS}{schema_id:010d}"


def _version_key(subject: str, version: int) -> str:
    return f"{_SUBJECTS}{_subject(subject)}/{version:010d}"


def encode_schema(schema: RegisteredSchema) -> bytes:
    references = [[r.name, r.subject, r.version] for r in schema.references]
    packed: bytes = msgpack.packb([schema.schema_type.value, schema.schema, references])
    return packed


def decode_schema(schema_id: int, value: bytes) -> RegisteredSchema:
    schema_type, text, references = msgpack.unpackb(value)
    return RegisteredSchema(
        schema_id,
        SchemaType(schema_type),
        text,
        tuple(SchemaReference(name, subject, version) for name, subject, version in references),
    )


class SchemaStore:
    """Reads and compare-and-set writes of the registry's keys; no registry rules here."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.metadata = metadata

    # --- schemas by id ------------------------------------------------------------------------

    async def schema(self, schema_id: int) -> RegisteredSchema | None:
        if not 0 < schema_id <= MAX_ID:
            return None
        record = await self.metadata.get(_id_key(schema_id))
        return decode_schema(schema_id, record.value) if record else None

    async def id_of(self, fingerprint: str) -> int | None:
        record = await self.metadata.get(_FINGERPRINTS + fingerprint)
        return int(record.value) if record else None

    async def claim(
        self,
        fingerprint: str,
        schema_type: SchemaType,
        text: str,
        references: Sequence[SchemaReference],
        wanted_id: int | None = None,
    ) -> int:
        """The id of the schema with ``fingerprint``, registering it first if it is new.

        With ``wanted_id`` (IMPORT mode) the schema gets that id.

        Raises:
            ConflictError: ``wanted_id`` holds another schema, or the schema already has
                another id.
        """
        existing = await self.id_of(fingerprint)
        if existing is not None:
            if wanted_id is not None and wanted_id != existing:
                raise ConflictError(f"the schema is already registered with id {existing}")
            return existing
        while True:
            schema_id = wanted_id or await counters.increment(self.metadata, ID_COUNTER)
            if schema_id > MAX_ID:
                raise ConflictError("every schema id is taken")
            value = encode_schema(RegisteredSchema(schema_id, schema_type, text, tuple(references)))
            try:
                await self.metadata.put(_id_key(schema_id), value, expected_version=MUST_NOT_EXIST)
                break
            except ConflictError:
                if wanted_id is not None:
                    held = await self.schema(wanted_id)
                    if held is not None and await self.id_of(fingerprint) == wanted_id:
                        return wanted_id
                    raise ConflictError(f"schema id {wanted_id} holds another schema") from None
                # An id imported past the counter: take the next one.
        try:
            await self.metadata.put(
                _FINGERPRINTS + fingerprint,
                str(schema_id).encode(),
                expected_version=MUST_NOT_EXIST,
            )
        except ConflictError:
            # Another broker registered the same schema meanwhile: its id is the schema's.
            await self.metadata.delete(_id_key(schema_id))
            winner = await self.id_of(fingerprint)
            if winner is None or (wanted_id is not None and winner != wanted_id):
                raise
            return winner
        return schema_id

    async def schema_ids(self) -> AsyncIterator[int]:
        async for record in self.metadata.scan_all(_IDS, prefix_end(_IDS)):
            yield int(record.key.removeprefix(_IDS))

    # --- subjects and versions ----------------------------------------------------------------

    async def versions(self, subject: str) -> list[Version]:
        """Every stored version of ``subject``, soft-deleted ones included, oldest first."""
        prefix = f"{_SUBJECTS}{_subject(subject)}/"
        return [
            _version(subject, record.key.removeprefix(prefix), record.value, record.version)
            async for record in self.metadata.scan_all(prefix, prefix_end(prefix))
        ]

    async def version(self, subject: str, version: int) -> Version | None:
        if not 0 < version <= MAX_ID:
            return None
        record = await self.metadata.get(_version_key(subject, version))
        return _version(subject, str(version), record.value, record.version) if record else None

    async def all_versions(self) -> AsyncIterator[Version]:
        """Every stored version of every subject, subject by subject."""
        async for record in self.metadata.scan_all(_SUBJECTS, prefix_end(_SUBJECTS)):
            quoted, _, version = record.key.removeprefix(_SUBJECTS).rpartition("/")
            yield _version(urllib.parse.unquote(quoted), version, record.value, record.version)

    async def add_version(self, subject: str, version: int, schema_id: int) -> None:
        """Raises ConflictError if another broker wrote that version first."""
        await self.metadata.put(
            _version_key(subject, version),
            msgpack.packb([schema_id, False]),
            expected_version=MUST_NOT_EXIST,
        )

    async def soft_delete(self, version: Version) -> None:
        """Raises ConflictError if the version changed meanwhile."""
        await self.metadata.put(
            _version_key(version.subject, version.version),
            msgpack.packb([version.schema_id, True]),
            expected_version=version.record_version,
        )

    async def hard_delete(self, version: Version) -> None:
        """Raises ConflictError if the version changed meanwhile."""
        await self.metadata.delete(
            _version_key(version.subject, version.version),
            expected_version=version.record_version,
        )

    # --- references between schemas -----------------------------------------------------------

    async def add_referrer(self, reference: SchemaReference, schema_id: int) -> None:
        key = f"{_referenced(reference.subject, reference.version)}{schema_id:010d}"
        await self.metadata.put(key, b"")

    async def referrers(self, subject: str, version: int) -> list[int]:
        """Ids of the schemas that reference ``subject`` at ``version``."""
        prefix = _referenced(subject, version)
        records = await self.metadata.scan(prefix, prefix_end(prefix))
        return [int(record.key.removeprefix(prefix)) for record in records]

    async def remove_referrer(self, reference: SchemaReference, schema_id: int) -> None:
        await self.metadata.delete(
            f"{_referenced(reference.subject, reference.version)}{schema_id:010d}"
        )

    # --- compatibility levels and modes --------------------------------------------------------

    async def setting(self, kind: str, subject: str | None) -> str | None:
        """A subject's compatibility level or mode (``kind`` "config" or "mode"), or the
        global one with ``subject=None``; ``None`` where none is set."""
        record = await self.metadata.get(_setting_key(kind, subject))
        return record.value.decode() if record else None

    async def set_setting(self, kind: str, subject: str | None, value: str) -> None:
        await self.metadata.put(_setting_key(kind, subject), value.encode())

    async def delete_setting(self, kind: str, subject: str | None) -> None:
        await self.metadata.delete(_setting_key(kind, subject))


def _referenced(subject: str, version: int) -> str:
    return f"{_REFERENCED}{_subject(subject)}/{version:010d}/"


def _setting_key(kind: str, subject: str | None) -> str:
    if kind == "config":
        return _GLOBAL_CONFIG if subject is None else _CONFIG + _subject(subject)
    if kind == "mode":
        return _GLOBAL_MODE if subject is None else _MODE + _subject(subject)
    raise ValueError(f"no setting {kind!r}")


def _version(subject: str, version: str, value: bytes, record_version: int) -> Version:
    schema_id, deleted = msgpack.unpackb(value)
    return Version(subject, int(version), schema_id, bool(deleted), record_version)
