"""The schema registry's rules, as Confluent's registry applies them: registering, looking up,
soft and permanent deletes, compatibility levels and modes. The HTTP API
(:mod:`icefloe.schemas.http`) maps requests to these methods and :class:`RegistryError` to
Confluent's error bodies.

Nothing is held in memory but parsed schemas by id (which never change): every broker reads
the metadata store, so what one broker registered another serves at once.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from icefloe.errors import ConflictError
from icefloe.ports.metadata import MetadataStore
from icefloe.schemas.formats import (
    InvalidSchema,
    ParsedSchema,
    Referenced,
    incompatibilities,
    parse,
)
from icefloe.schemas.model import RegisteredSchema, SchemaReference, SchemaType
from icefloe.schemas.store import MAX_ID, SchemaStore, Version

LEVELS: Final = (
    "NONE",
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
)
DEFAULT_LEVEL: Final = "BACKWARD"
MODES: Final = ("READWRITE", "READONLY", "IMPORT")
DEFAULT_MODE: Final = "READWRITE"
MAX_REFERENCE_DEPTH: Final = 32
PARSED_CACHE: Final = 256
_REGISTER_ATTEMPTS: Final = 20


class RegistryError(Exception):
    """A refusal with Confluent's error code (40401, 42201, 409, …)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        """The HTTP status: the code's first three digits."""
        return self.code if self.code < 1000 else self.code // 100


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(40401, f"Subject '{subject}' not found.")


def version_not_found(version: object) -> RegistryError:
    return RegistryError(40402, f"Version {version} not found.")


@dataclass(frozen=True)
class SubjectVersion:
    subject: str
    version: int
    schema: RegisteredSchema
    deleted: bool = False


class Registry:
    """The registry over the metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.store = SchemaStore(metadata)
        self._parsed: collections.OrderedDict[int, ParsedSchema] = collections.OrderedDict()

    # --- schemas ------------------------------------------------------------------------------

    async def schema(self, schema_id: int) -> RegisteredSchema:
        schema = await self.store.schema(schema_id)
        if schema is None:
            raise RegistryError(40403, f"Schema {schema_id} not found")
        return schema

    async def resolve(
        self, references: Sequence[SchemaReference], depth: int = 0
    ) -> list[Referenced]:
        """Each reference's schema (and theirs), or 42201 naming the one missing."""
        if depth > MAX_REFERENCE_DEPTH:
            raise RegistryError(42201, "Invalid schema: references nest too deeply")
        found = []
        for reference in references:
            version = await self.store.version(reference.subject, reference.version)
            schema = await self.store.schema(version.schema_id) if version else None
            if schema is None:
                raise RegistryError(
                    42201,
                    f"Invalid schema: reference {reference.name!r} to subject "
                    f"'{reference.subject}' version {reference.version} is not registered",
                )
            inner = await self.resolve(schema.references, depth + 1)
            found.append(Referenced(reference.name, schema, tuple(inner)))
        return found

    async def parse(
        self, schema_type: SchemaType, text: str, references: Sequence[SchemaReference]
    ) -> ParsedSchema:
        resolved = await self.resolve(references)
        try:
            # Parsing may run protoc or walk a large document: off the event loop.
            return await asyncio.to_thread(parse, schema_type, text, resolved)
        except InvalidSchema as exc:
            raise RegistryError(42201, str(exc)) from None

    async def parsed(self, schema: RegisteredSchema) -> ParsedSchema:
        """A stored schema, parsed once per id."""
        found = self._parsed.get(schema.id)
        if found is None:
            found = await self.parse(schema.schema_type, schema.schema, schema.references)
            self._parsed[schema.id] = found
            if len(self._parsed) > PARSED_CACHE:
                self._parsed.popitem(last=False)
        return found

    # --- subjects -----------------------------------------------------------------------------

    async def subjects(self, deleted: bool = False, prefix: str = "") -> list[str]:
        found: dict[str, bool] = {}
        async for version in self.store.all_versions():
            if version.subject.startswith(prefix):
                found[version.subject] = found.get(version.subject, False) or not version.deleted
        return sorted(s for s, live in found.items() if live or deleted)

    async def _versions(self, subject: str, deleted: bool = False) -> list[Version]:
        """The subject's versions (soft-deleted ones with ``deleted``), or 40401."""
        versions = [v for v in await self.store.versions(subject) if deleted or not v.deleted]
        if not versions:
            raise subject_not_found(subject)
        return versions

    async def versions(self, subject: str, deleted: bool = False) -> list[int]:
        return [v.version for v in await self._versions(subject, deleted)]

    async def version(self, subject: str, version: str, deleted: bool = False) -> SubjectVersion:
        """``version`` is a number, ``latest`` or ``-1``."""
        found = await self._version(subject, parse_version(version), deleted)
        return SubjectVersion(
            subject, found.version, await self.schema(found.schema_id), found.deleted
        )

    async def _version(self, subject: str, number: int | None, deleted: bool) -> Version:
        versions = await self._versions(subject, deleted)
        if number is None:
            return versions[-1]
        for found in versions:
            if found.version == number:
                return found
        raise version_not_found(number)

    async def referenced_by(self, subject: str, version: str) -> list[int]:
        found = await self._version(subject, parse_version(version), deleted=True)
        return sorted(await self.store.referrers(subject, found.version))

    async def subjects_of(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        await self.schema(schema_id)
        return [
            (v.subject, v.version)
            async for v in self.store.all_versions()
            if v.schema_id == schema_id and (deleted or not v.deleted)
        ]

    # --- registering --------------------------------------------------------------------------

    @staticmethod
    def fingerprint(parsed: ParsedSchema, references: Sequence[SchemaReference]) -> str:
        identity = [
            parsed.schema_type.value,
            parsed.canonical,
            [[r.name, r.subject, r.version] for r in references],
        ]
        return hashlib.sha256(json.dumps(identity).encode()).hexdigest()

    async def register(
        self,
        subject: str,
        schema_type: SchemaType,
        text: str,
        references: Sequence[SchemaReference] = (),
        schema_id: int | None = None,
        version: int | None = None,
    ) -> tuple[int, int]:
        """Register a schema under ``subject``; return its id and version. The same schema
        again gets its id and version back."""
        mode = await self.mode(subject, default_to_global=True)
        if mode == "READONLY":
            raise RegistryError(42205, f"Subject {subject} is in read-only mode")
        if (schema_id is not None or version is not None) and mode != "IMPORT":
            raise RegistryError(42205, "A schema id or version can only be given in IMPORT mode")
        parsed = await self.parse(schema_type, text, references)
        fingerprint = self.fingerprint(parsed, references)
        for _ in range(_REGISTER_ATTEMPTS):
            stored = await self.store.versions(subject)
            live = [v for v in stored if not v.deleted]
            known = await self.store.id_of(fingerprint)
            for existing in reversed(live):
                if existing.schema_id == known and schema_id in (None, known):
                    return existing.schema_id, existing.version
            if mode != "IMPORT":
                level = await self.config(subject, default_to_global=True)
                problems = await self._check(level, parsed, live)
                if problems:
                    raise RegistryError(
                        409,
                        f"Schema being registered is incompatible with an earlier schema for "
                        f'subject "{subject}", details: [{"; ".join(problems)}]',
                    )
            try:
                new_id = await self.store.claim(
                    fingerprint, schema_type, _stored_text(parsed, text), references, schema_id
                )
            except ConflictError as exc:
                raise RegistryError(42207, f"Schema id does not match: {exc}") from None
            number = version or (stored[-1].version + 1 if stored else 1)
            if number > MAX_ID:
                raise RegistryError(42202, f"The specified version '{number}' is not valid")
            try:
                await self.store.add_version(subject, number, new_id)
            except ConflictError:
                if version is not None:
                    raise RegistryError(
                        42205, f"Version {version} of subject {subject} already exists"
                    ) from None
                continue  # another broker added a version meanwhile: check against it too
            for reference in references:
                await self.store.add_referrer(reference, new_id)
            return new_id, number
        raise RegistryError(50001, "Too many concurrent registrations; try again")

    async def lookup(
        self,
        subject: str,
        schema_type: SchemaType,
        text: str,
        references: Sequence[SchemaReference] = (),
        deleted: bool = False,
    ) -> SubjectVersion:
        versions = await self._versions(subject, deleted)
        parsed = await self.parse(schema_type, text, references)
        schema_id = await self.store.id_of(self.fingerprint(parsed, references))
        for found in reversed(versions):
            if found.schema_id == schema_id:
                return SubjectVersion(subject, found.version, await self.schema(schema_id))
        raise RegistryError(40403, "Schema not found")

    # --- compatibility ------------------------------------------------------------------------

    async def _check(self, level: str, new: ParsedSchema, live: Sequence[Version]) -> list[str]:
        if level == "NONE" or not live:
            return []
        targets = live if level.endswith("_TRANSITIVE") else live[-1:]
        problems = []
        for target in reversed(targets):
            old = await self.parsed(await self.schema(target.schema_id))
            if level.startswith(("BACKWARD", "FULL")):
                problems += incompatibilities(new, old)
            if level.startswith(("FORWARD", "FULL")):
                problems += incompatibilities(old, new)
        return problems

    async def compatibility(
        self,
        subject: str,
        version: str | None,
        schema_type: SchemaType,
        text: str,
        references: Sequence[SchemaReference] = (),
    ) -> list[str]:
        """Why the schema may not be registered under ``subject`` (empty: it may), against
        ``version`` or, with ``None``, against the versions the level names."""
        parsed = await self.parse(schema_type, text, references)
        level = await self.config(subject, default_to_global=True)
        number = parse_version(version) if version is not None else None
        live = [v for v in await self.store.versions(subject) if not v.deleted]
        if version is None:
            return await self._check(level, parsed, live)
        if not live:
            if number is None:
                return []  # nothing yet: anything is compatible with "latest"
            raise subject_not_found(subject)
        target = await self._version(subject, number, deleted=False)
        return await self._check(level.removesuffix("_TRANSITIVE"), parsed, [target])

    # --- deleting -----------------------------------------------------------------------------

    async def _writable(self, subject: str) -> None:
        if await self.mode(subject, default_to_global=True) == "READONLY":
            raise RegistryError(42205, f"Subject {subject} is in read-only mode")

    async def _unreferenced(self, version: Version) -> None:
        referrers = await self.store.referrers(version.subject, version.version)
        if referrers:
            raise RegistryError(
                42206,
                f"One or more references exist to the schema "
                f"{{subject={version.subject},version={version.version}}}: ids {referrers}",
            )

    async def delete_subject(self, subject: str, permanent: bool = False) -> list[int]:
        await self._writable(subject)
        stored = await self.store.versions(subject)
        if not stored:
            raise subject_not_found(subject)
        live = [v for v in stored if not v.deleted]
        if not permanent and not live:
            raise RegistryError(
                40404,
                f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently",
            )
        if permanent and live:
            raise RegistryError(
                40405,
                f"Subject '{subject}' was not deleted first before being permanently deleted",
            )
        targets = stored if permanent else live
        for version in targets:
            await self._unreferenced(version)
        for version in targets:
            await self._delete(version, permanent)
        if permanent:  # as Confluent does: the subject's level and mode go with it
            await self.store.delete_setting("config", subject)
            await self.store.delete_setting("mode", subject)
        return [v.version for v in targets]

    async def delete_version(self, subject: str, version: str, permanent: bool = False) -> int:
        await self._writable(subject)
        number = parse_version(version)
        # "latest" is the latest live version for a soft delete; a number may name a deleted one.
        found = await self._version(subject, number, deleted=permanent or number is not None)
        if not permanent and found.deleted:
            raise RegistryError(
                40406,
                f"Subject '{subject}' Version {found.version} was soft deleted.Set "
                "permanent=true to delete permanently",
            )
        if permanent and not found.deleted:
            raise RegistryError(
                40407,
                f"Subject '{subject}' Version {found.version} was not deleted first before "
                "being permanently deleted",
            )
        await self._unreferenced(found)
        await self._delete(found, permanent)
        return found.version

    async def _delete(self, version: Version, permanent: bool) -> None:
        try:
            if permanent:
                await self.store.hard_delete(version)
                await self._forget_references(version.schema_id)
            else:
                await self.store.soft_delete(version)
        except ConflictError:
            raise RegistryError(
                50001, f"Subject '{version.subject}' changed meanwhile; try again"
            ) from None

    async def _forget_references(self, schema_id: int) -> None:
        """Once no version uses a schema, what it references may be deleted."""
        async for version in self.store.all_versions():
            if version.schema_id == schema_id:
                return
        schema = await self.store.schema(schema_id)
        for reference in schema.references if schema else ():
            await self.store.remove_referrer(reference, schema_id)

    # --- compatibility levels and modes -------------------------------------------------------

    async def config(self, subject: str | None, default_to_global: bool = False) -> str:
        return await self._setting("config", subject, default_to_global, DEFAULT_LEVEL, 40408)

    async def mode(self, subject: str | None, default_to_global: bool = False) -> str:
        return await self._setting("mode", subject, default_to_global, DEFAULT_MODE, 40409)

    async def _setting(
        self, kind: str, subject: str | None, to_global: bool, default: str, missing: int
    ) -> str:
        if subject is not None:
            value = await self.store.setting(kind, subject)
            if value is not None:
                return value
            if not to_global:
                what = "compatibility" if kind == "config" else "mode"
                raise RegistryError(
                    missing, f"Subject '{subject}' does not have subject-level {what} configured"
                )
        return await self.store.setting(kind, None) or default

    async def set_config(self, subject: str | None, level: object) -> str:
        if not isinstance(level, str) or level.upper() not in LEVELS:
            raise RegistryError(42203, f"Invalid compatibility level: {level!r}")
        await self.store.set_setting("config", subject, level.upper())
        return level.upper()

    async def delete_config(self, subject: str | None) -> str:
        before = await self.config(subject, default_to_global=subject is None)
        await self.store.delete_setting("config", subject)
        return before

    async def set_mode(self, subject: str | None, mode: object, force: bool = False) -> str:
        """As Confluent's: IMPORT only where no schema is registered yet, unless forced."""
        if not isinstance(mode, str) or mode.upper() not in MODES:
            raise RegistryError(42204, f"Invalid mode: {mode!r}")
        if mode.upper() == "IMPORT" and not force:
            if subject is None:
                taken = bool(await self.subjects())
            else:
                taken = any(not v.deleted for v in await self.store.versions(subject))
            if taken:
                raise RegistryError(
                    42205, "Cannot import since found existing subjects; set force=true"
                )
        await self.store.set_setting("mode", subject, mode.upper())
        return mode.upper()

    async def delete_mode(self, subject: str | None) -> str:
        before = await self.mode(subject, default_to_global=subject is None)
        await self.store.delete_setting("mode", subject)
        return before


def parse_version(version: str) -> int | None:
    """A version number, or ``None`` for the latest; 42202 for anything else."""
    if version in ("latest", "-1"):
        return None
    if version.isascii() and version.isdigit() and len(version) <= 10:
        number = int(version)
        if 0 < number <= MAX_ID:
            return number
    raise RegistryError(
        42202,
        f"The specified version '{version[:50]}' is not a valid version id. Allowed values are "
        'between [1, 2^31-1] and the string "latest"',
    )


def _stored_text(parsed: ParsedSchema, text: str) -> str:
    """What is kept and served back: the canonical form for JSON-based languages (compact,
    as Confluent serves them), the text as given for Protobuf."""
    return text if parsed.schema_type is SchemaType.PROTOBUF else parsed.canonical
