"""Where decoders find schemas: :func:`open_lookup` picks the registry Icefloe keeps in the
metadata store, or the external one ``[schema_registry] url`` names.

Both cache schemas by id, which never change once registered; a reference (a subject at a
version) is resolved afresh each time, since a permanent delete may free a version number.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import urllib.parse
from typing import Any, Final

import aiohttp

from icefloe.config import Config
from icefloe.errors import UnavailableError
from icefloe.ports.metadata import MetadataStore
from icefloe.schemas.model import RegisteredSchema, SchemaLookup, SchemaReference, SchemaType
from icefloe.schemas.store import MAX_ID, SchemaStore

CACHED_SCHEMAS: Final = 4096
"""Schemas each lookup keeps by id (least recently used ones go first)."""
REQUEST_TIMEOUT_S: Final = 10.0
MAX_RESPONSE_BYTES: Final = 8 << 20


class _Cache:
    """A bounded map from id to schema, least recently used first out."""

    def __init__(self, size: int = CACHED_SCHEMAS) -> None:
        self._size = size
        self._schemas: collections.OrderedDict[int, RegisteredSchema] = collections.OrderedDict()

    def get(self, schema_id: int) -> RegisteredSchema | None:
        schema = self._schemas.get(schema_id)
        if schema is not None:
            self._schemas.move_to_end(schema_id)
        return schema

    def put(self, schema: RegisteredSchema) -> None:
        self._schemas[schema.id] = schema
        if len(self._schemas) > self._size:
            self._schemas.popitem(last=False)


class StoreLookup:
    """Schemas from the registry Icefloe serves, read straight from the metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._store = SchemaStore(metadata)
        self._cache = _Cache()

    async def by_id(self, schema_id: int) -> RegisteredSchema | None:
        schema = self._cache.get(schema_id)
        if schema is None:
            schema = await self._store.schema(schema_id)
            if schema is not None:
                self._cache.put(schema)
        return schema

    async def by_reference(self, reference: SchemaReference) -> RegisteredSchema | None:
        version = await self._store.version(reference.subject, reference.version)
        if version is None:
            return None
        return await self.by_id(version.schema_id)

    async def close(self) -> None:
        """Nothing to release; here so that either lookup can be closed alike."""


class RemoteLookup:
    """Schemas from an external Confluent-compatible registry, over its REST API."""

    def __init__(self, url: str, user_info: str | None = None) -> None:
        self._url = url.rstrip("/")
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json"}
        if user_info:
            token = base64.b64encode(user_info.encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._cache = _Cache()
        self._session: aiohttp.ClientSession | None = None

    async def by_id(self, schema_id: int) -> RegisteredSchema | None:
        schema = self._cache.get(schema_id)
        if schema is not None:
            return schema
        if not 0 < schema_id <= MAX_ID:
            return None
        body = await self._get(f"/schemas/ids/{schema_id}")
        if body is None:
            return None
        schema = _registered(schema_id, body)
        self._cache.put(schema)
        return schema

    async def by_reference(self, reference: SchemaReference) -> RegisteredSchema | None:
        subject = urllib.parse.quote(reference.subject, safe="")
        body = await self._get(f"/subjects/{subject}/versions/{reference.version}")
        if body is None:
            return None
        return _registered(int(body["id"]), body)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str) -> dict[str, Any] | None:
        """The JSON body at ``path``, or ``None`` on 404."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S), headers=self._headers
            )
        try:
            async with self._session.get(self._url + path) as response:
                if response.status == 404:
                    return None
                if response.status != 200:
                    text = (await response.content.read(1000)).decode(errors="replace")
                    raise UnavailableError(
                        f"schema registry {self._url} answered {response.status}: {text}"
                    )
                raw = await response.content.read(MAX_RESPONSE_BYTES + 1)
                if len(raw) > MAX_RESPONSE_BYTES:
                    raise UnavailableError(f"schema registry {self._url}: answer too large")
                body = await asyncio.to_thread(_json, raw)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UnavailableError(f"schema registry {self._url}: {exc}") from exc
        if not isinstance(body, dict):
            raise UnavailableError(f"schema registry {self._url}: unexpected answer {body!r:.200}")
        return body


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise UnavailableError(f"schema registry answer is not JSON: {exc}") from exc


def _registered(schema_id: int, body: dict[str, Any]) -> RegisteredSchema:
    try:
        return RegisteredSchema(
            schema_id,
            SchemaType(body.get("schemaType", "AVRO")),
            str(body["schema"]),
            tuple(
                SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"]))
                for r in body.get("references") or ()
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise UnavailableError(f"schema registry answered an unexpected schema: {exc}") from exc


def open_lookup(config: Config, metadata: MetadataStore) -> StoreLookup | RemoteLookup:
    """The lookup decoders use: the external registry ``[schema_registry] url`` names, else
    the registry kept in ``metadata``. Close it with ``await lookup.close()``."""
    options = config.schema_registry
    if options.url is not None:
        secret = options.basic_auth_user_info
        return RemoteLookup(options.url, secret.get_secret_value() if secret else None)
    return StoreLookup(metadata)


def _check_protocol(lookup: StoreLookup | RemoteLookup) -> SchemaLookup:
    return lookup  # mypy checks that both lookups satisfy the shared protocol
