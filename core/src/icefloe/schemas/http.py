"""The Confluent-compatible REST API of the schema registry, on aiohttp.

Every input is distrusted: a body is read up to ``MAX_BODY_BYTES`` (413 past it), must be a
JSON object with fields of the right types, and every refusal is Confluent's error body
``{"error_code": …, "message": …}``; an unexpected failure is logged and answered 50001, and
never ends the broker.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from icefloe.errors import IcefloeError
from icefloe.ports.metadata import MetadataStore
from icefloe.schemas.model import RegisteredSchema, SchemaReference, SchemaType
from icefloe.schemas.protobuf_schema import decode_serialized, serialized
from icefloe.schemas.protobuf_text import to_text
from icefloe.schemas.registry import Registry, RegistryError, SubjectVersion
from icefloe.schemas.store import MAX_ID

log = logging.getLogger(__name__)

CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"
MAX_BODY_BYTES: Final = 2 << 20
MAX_SCHEMA_CHARS: Final = 512 << 10
"""A stored schema must fit one metadata value (1 MiB) with its references."""
MAX_SUBJECT_CHARS: Final = 255
MAX_REFERENCES: Final = 100
REQUEST_TIMEOUT_S: Final = 30.0
MAX_IN_FLIGHT: Final = 16
"""Requests handled at once; more wait their turn, so bodies in memory stay under
``MAX_IN_FLIGHT * MAX_BODY_BYTES`` whatever the number of connections."""

AUTH_CACHE_S: Final = 60.0
"""How long a checked login is taken without checking its password again (a deleted user or a
changed password takes effect within this)."""
FAILED_LOGIN_DELAY_S: Final = 0.1
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Authenticate = Callable[[str, str], Awaitable[bool]]
"""Whether a user name and password are a valid login."""


def _answer(body: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(body), status=status, content_type=CONTENT_TYPE.split(";")[0]
    )


def _error(code: int, message: str) -> web.Response:
    status = code if code < 1000 else code // 100
    return _answer({"error_code": code, "message": message}, status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            return await handler(request)
    except RegistryError as exc:
        return _error(exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status >= 400:
            return _error(exc.status, f"HTTP {exc.status} {exc.reason}")
        raise
    except TimeoutError:
        return _error(50002, "Operation timed out")
    except IcefloeError as exc:
        log.warning("schema registry: %s %s failed: %s", request.method, request.path, exc)
        return _error(50001, f"Error in the backend data store: {exc}")
    except Exception:
        log.exception("schema registry: %s %s failed", request.method, request.path)
        return _error(50001, "Error in the backend data store")


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "false").lower() == "true"


def _subject(request: web.Request) -> str:
    subject = request.match_info["subject"]
    if (
        not subject
        or len(subject) > MAX_SUBJECT_CHARS
        or any(ord(c) < 32 or ord(c) == 127 for c in subject)
    ):
        raise RegistryError(42208, f"Invalid subject {subject[:MAX_SUBJECT_CHARS]!r}")
    return subject


def _schema_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and 0 < int(raw) <= MAX_ID):
        raise RegistryError(40403, f"Schema {raw[:20]} not found")
    return int(raw)


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):
        raise RegistryError(400, "Unexpected character in the request body: not JSON") from None
    if not isinstance(body, dict):
        raise RegistryError(422, "The request body must be a JSON object")
    return body


class _SchemaRequest:
    """The schema fields of a register, lookup or compatibility body."""

    def __init__(self, body: dict[str, Any]) -> None:
        schema = body.get("schema")
        if not isinstance(schema, str) or not schema.strip():
            raise RegistryError(42201, "Invalid schema: the schema is missing or empty")
        if len(schema) > MAX_SCHEMA_CHARS:
            raise RegistryError(42209, f"Schema too large: over {MAX_SCHEMA_CHARS} characters")
        kind = body.get("schemaType") or "AVRO"
        if kind not in SchemaType.__members__:
            raise RegistryError(42201, f"Invalid schema type {str(kind)[:50]!r}")
        references = body.get("references") or []
        if not isinstance(references, list) or len(references) > MAX_REFERENCES:
            raise RegistryError(42201, "Invalid schema: references must be a short list")
        self.text = schema
        self.schema_type = SchemaType(kind)
        self.references = tuple(_reference(r) for r in references)


def _reference(raw: object) -> SchemaReference:
    if isinstance(raw, dict):
        name, subject, version = raw.get("name"), raw.get("subject"), raw.get("version")
        if (
            isinstance(name, str)
            and name
            and isinstance(subject, str)
            and subject
            and isinstance(version, int)
            and not isinstance(version, bool)
            and 0 < version <= MAX_ID
        ):
            return SchemaReference(name, subject, version)
    raise RegistryError(42201, f"Invalid schema reference {str(raw)[:200]}")


def _optional_int(body: dict[str, Any], name: str, code: int) -> int | None:
    value = body.get(name)
    if value is None or (name == "id" and value == -1):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_ID:
        raise RegistryError(code, f"Invalid {name} {str(value)[:50]}")
    return value


def _references(found: tuple[SchemaReference, ...]) -> list[dict[str, Any]]:
    return [{"name": r.name, "subject": r.subject, "version": r.version} for r in found]


def _version_body(found: SubjectVersion, text: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "subject": found.subject,
        "version": found.version,
        "id": found.schema.id,
        "schema": text,
    }
    if found.schema.schema_type is not SchemaType.AVRO:
        body["schemaType"] = found.schema.schema_type.value
    if found.schema.references:
        body["references"] = _references(found.schema.references)
    if found.deleted:
        body["deleted"] = True
    return body


class RegistryApi:
    """The routes, over one :class:`Registry`."""

    def __init__(self, metadata: MetadataStore) -> None:
        self.registry = Registry(metadata)
        self._converted: dict[tuple[int, bool], str] = {}
        """Protobuf schemas in the other form than they were registered in, by id and form."""

    def app(self) -> web.Application:
        turns = asyncio.Semaphore(MAX_IN_FLIGHT)

        @web.middleware
        async def one_of_a_few(request: web.Request, handler: Handler) -> web.StreamResponse:
            async with turns:
                return await handler(request)

        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[one_of_a_few, _errors])
        r = app.router
        r.add_get("/", self.root)
        r.add_get("/schemas/types", self.types)
        r.add_get("/schemas/ids/{id}", self.schema_by_id)
        r.add_get("/schemas/ids/{id}/schema", self.raw_schema_by_id)
        r.add_get("/schemas/ids/{id}/subjects", self.subjects_by_id)
        r.add_get("/schemas/ids/{id}/versions", self.versions_by_id)
        r.add_get("/subjects", self.subjects)
        r.add_post("/subjects/{subject}", self.lookup)
        r.add_delete("/subjects/{subject}", self.delete_subject)
        r.add_get("/subjects/{subject}/versions", self.versions)
        r.add_post("/subjects/{subject}/versions", self.register)
        r.add_get("/subjects/{subject}/versions/{version}", self.version)
        r.add_get("/subjects/{subject}/versions/{version}/schema", self.raw_version)
        r.add_get("/subjects/{subject}/versions/{version}/referencedby", self.referenced_by)
        r.add_delete("/subjects/{subject}/versions/{version}", self.delete_version)
        r.add_post("/compatibility/subjects/{subject}/versions", self.compatible)
        r.add_post("/compatibility/subjects/{subject}/versions/{version}", self.compatible)
        for path, subject in (("/config", False), ("/config/{subject}", True)):
            r.add_get(path, self.get_config if subject else self.get_global_config)
            r.add_put(path, self.put_config)
            r.add_delete(path, self.delete_config)
        for path, subject in (("/mode", False), ("/mode/{subject}", True)):
            r.add_get(path, self.get_mode if subject else self.get_global_mode)
            r.add_put(path, self.put_mode)
            r.add_delete(path, self.delete_mode)
        return app

    def _optional_subject(self, request: web.Request) -> str | None:
        return _subject(request) if "subject" in request.match_info else None

    async def root(self, request: web.Request) -> web.Response:
        return _answer({})

    async def types(self, request: web.Request) -> web.Response:
        return _answer(["JSON", "PROTOBUF", "AVRO"])

    async def _schema_text(self, request: web.Request, schema_id: int) -> tuple[Any, str]:
        schema = await self.registry.schema(schema_id)
        return schema, await self._shown(request, schema)

    async def _shown(self, request: web.Request, schema: RegisteredSchema) -> str:
        """The schema's text as the request asks for it: a Protobuf schema as base64 of its
        descriptor with ``format=serialized``, else as ``.proto`` text where it prints."""
        if schema.schema_type is not SchemaType.PROTOBUF:
            return schema.schema
        wanted = request.query.get("format") == "serialized"
        is_serialized = decode_serialized(schema.schema) is not None
        if wanted == is_serialized:
            return schema.schema
        key = (schema.id, wanted)
        text = self._converted.get(key)
        if text is None:
            if wanted:
                references = await self.registry.resolve(schema.references)
                text = await asyncio.to_thread(serialized, schema.schema, references)
            else:
                text = to_text(decode_serialized(schema.schema)) or schema.schema
            self._converted[key] = text
            if len(self._converted) > 1024:
                self._converted.pop(next(iter(self._converted)))
        return text

    async def schema_by_id(self, request: web.Request) -> web.Response:
        schema, text = await self._schema_text(request, _schema_id(request))
        subject = request.query.get("subject")
        if subject and not any(s == subject for s, _ in await self.registry.subjects_of(schema.id)):
            raise RegistryError(40403, f"Schema {schema.id} not found")
        body: dict[str, Any] = {"schema": text}
        if schema.schema_type is not SchemaType.AVRO:
            body["schemaType"] = schema.schema_type.value
        if schema.references:
            body["references"] = _references(schema.references)
        return _answer(body)

    async def raw_schema_by_id(self, request: web.Request) -> web.Response:
        _, text = await self._schema_text(request, _schema_id(request))
        return web.Response(text=text, content_type="text/plain")

    async def subjects_by_id(self, request: web.Request) -> web.Response:
        found = await self.registry.subjects_of(_schema_id(request), _flag(request, "deleted"))
        return _answer(sorted({s for s, _ in found}))

    async def versions_by_id(self, request: web.Request) -> web.Response:
        found = await self.registry.subjects_of(_schema_id(request), _flag(request, "deleted"))
        return _answer([{"subject": s, "version": v} for s, v in found])

    async def subjects(self, request: web.Request) -> web.Response:
        prefix = request.query.get("subjectPrefix", "")
        return _answer(await self.registry.subjects(_flag(request, "deleted"), prefix))

    async def versions(self, request: web.Request) -> web.Response:
        return _answer(await self.registry.versions(_subject(request), _flag(request, "deleted")))

    async def register(self, request: web.Request) -> web.Response:
        subject = _subject(request)
        body = await _body(request)
        schema = _SchemaRequest(body)
        schema_id, version = await self.registry.register(
            subject,
            schema.schema_type,
            schema.text,
            schema.references,
            _optional_int(body, "id", 42205),
            _optional_int(body, "version", 42202),
        )
        return _answer({"id": schema_id, "version": version})

    async def lookup(self, request: web.Request) -> web.Response:
        subject = _subject(request)
        schema = _SchemaRequest(await _body(request))
        found = await self.registry.lookup(
            subject, schema.schema_type, schema.text, schema.references, _flag(request, "deleted")
        )
        return _answer(_version_body(found, await self._shown(request, found.schema)))

    async def version(self, request: web.Request) -> web.Response:
        found = await self.registry.version(
            _subject(request), request.match_info["version"], _flag(request, "deleted")
        )
        return _answer(_version_body(found, await self._shown(request, found.schema)))

    async def raw_version(self, request: web.Request) -> web.Response:
        found = await self.registry.version(
            _subject(request), request.match_info["version"], _flag(request, "deleted")
        )
        text = await self._shown(request, found.schema)
        return web.Response(text=text, content_type="text/plain")

    async def referenced_by(self, request: web.Request) -> web.Response:
        ids = await self.registry.referenced_by(_subject(request), request.match_info["version"])
        return _answer(ids)

    async def delete_subject(self, request: web.Request) -> web.Response:
        permanent = _flag(request, "permanent")
        return _answer(await self.registry.delete_subject(_subject(request), permanent))

    async def delete_version(self, request: web.Request) -> web.Response:
        version = request.match_info["version"]
        permanent = _flag(request, "permanent")
        return _answer(await self.registry.delete_version(_subject(request), version, permanent))

    async def compatible(self, request: web.Request) -> web.Response:
        subject = _subject(request)
        schema = _SchemaRequest(await _body(request))
        problems = await self.registry.compatibility(
            subject,
            request.match_info.get("version"),
            schema.schema_type,
            schema.text,
            schema.references,
        )
        body: dict[str, Any] = {"is_compatible": not problems}
        if _flag(request, "verbose"):
            body["messages"] = problems
        return _answer(body)

    async def get_global_config(self, request: web.Request) -> web.Response:
        return _answer({"compatibilityLevel": await self.registry.config(None)})

    async def get_config(self, request: web.Request) -> web.Response:
        level = await self.registry.config(_subject(request), _flag(request, "defaultToGlobal"))
        return _answer({"compatibilityLevel": level})

    async def put_config(self, request: web.Request) -> web.Response:
        subject = self._optional_subject(request)
        body = await _body(request)
        level = body.get("compatibility") or body.get("compatibilityLevel")
        return _answer({"compatibility": await self.registry.set_config(subject, level)})

    async def delete_config(self, request: web.Request) -> web.Response:
        before = await self.registry.delete_config(self._optional_subject(request))
        return _answer({"compatibilityLevel": before})

    async def get_global_mode(self, request: web.Request) -> web.Response:
        return _answer({"mode": await self.registry.mode(None)})

    async def get_mode(self, request: web.Request) -> web.Response:
        mode = await self.registry.mode(_subject(request), _flag(request, "defaultToGlobal"))
        return _answer({"mode": mode})

    async def put_mode(self, request: web.Request) -> web.Response:
        subject = self._optional_subject(request)
        mode = (await _body(request)).get("mode")
        force = _flag(request, "force")
        return _answer({"mode": await self.registry.set_mode(subject, mode, force)})

    async def delete_mode(self, request: web.Request) -> web.Response:
        return _answer({"mode": await self.registry.delete_mode(self._optional_subject(request))})


class BasicAuth:
    """HTTP basic authentication of every request, against ``authenticate``; checked logins
    are remembered for ``AUTH_CACHE_S`` so that each request does not cost a password hash."""

    def __init__(self, authenticate: Authenticate, cache_size: int = 1024) -> None:
        self._authenticate = authenticate
        self._checked: dict[bytes, float] = {}
        self._cache_size = cache_size

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "basic" and await self._valid(token.strip()):
            return await handler(request)
        await asyncio.sleep(FAILED_LOGIN_DELAY_S)  # slows guessing, as Kafka logins do
        response = _error(401, "Unauthorized")
        response.headers["WWW-Authenticate"] = 'Basic realm="icefloe-schema-registry"'
        return response

    async def _valid(self, token: str) -> bool:
        key = hashlib.sha256(token.encode()).digest()
        now = time.monotonic()
        if self._checked.get(key, 0.0) > now:
            return True
        try:
            user, separator, password = (
                base64.b64decode(token, validate=True).decode().partition(":")
            )
        except (binascii.Error, ValueError):
            return False
        if not separator or not user:
            return False
        try:
            if not await self._authenticate(user, password):
                return False
        except (IcefloeError, ValueError):  # a name no key can hold, a store that failed
            log.warning("schema registry: cannot check the login of %.100r", user, exc_info=True)
            return False
        if len(self._checked) >= self._cache_size:
            self._checked = {k: t for k, t in self._checked.items() if t > now}
            if len(self._checked) >= self._cache_size:
                self._checked.clear()
        self._checked[key] = now + AUTH_CACHE_S
        return True


class RegistryServer:
    """The API listening on one port, in the broker's event loop; with ``authenticate``, every
    request must log in with HTTP basic authentication."""

    def __init__(self, metadata: MetadataStore, authenticate: Authenticate | None = None) -> None:
        self.api = RegistryApi(metadata)
        self._auth = BasicAuth(authenticate) if authenticate is not None else None
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int, tls: Any = None) -> int:
        """Listen on ``host:port`` (0: a free port), over HTTPS with an ``ssl`` context;
        return the bound port."""
        app = self.api.app()
        if self._auth is not None:
            app.middlewares.insert(0, self._auth.middleware)
        self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=15)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=tls, backlog=128)
        await site.start()
        return int(self._runner.addresses[0][1])

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
