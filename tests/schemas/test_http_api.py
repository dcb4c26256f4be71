"""The registry's HTTP API against hostile and malformed input: each refusal is Confluent's
error code, and the registry keeps serving what it held. Served by aiohttp on the embedded
metadata store."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
from icefloe.errors import UnavailableError
from icefloe.ports.base import OpenContext
from icefloe.schemas.http import MAX_BODY_BYTES, RegistryApi, RegistryServer
from icefloe.schemas.lookup import RemoteLookup, StoreLookup
from icefloe.schemas.model import RegisteredSchema, SchemaReference, SchemaType
from icefloe.schemas.protobuf_schema import decode_serialized
from icefloe.security.users import ScramCredential, UserStore

RECORD = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]})


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[TestClient[Any, Any]]:
    metadata = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    async with TestClient(TestServer(RegistryApi(metadata).app())) as client:
        yield client
    await metadata.close()


async def call(
    client: TestClient[Any, Any], method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    async with client.request(method, path, data=data) as response:
        assert response.content_type == "application/vnd.schemaregistry.v1+json"
        return response.status, await response.json(content_type=None)


async def test_malformed_requests_get_confluent_error_codes(
    client: TestClient[Any, Any],
) -> None:
    status, body = await call(client, "POST", "/subjects/s/versions", {"schema": RECORD})
    assert (status, body["id"], body["version"]) == (200, 1, 1)
    cases: list[tuple[str, str, Any, bytes | None, int, int]] = [
        ("POST", "/subjects/s/versions", None, b"{not json", 400, 400),
        ("POST", "/subjects/s/versions", None, b"[1, 2]", 422, 422),
        ("POST", "/subjects/s/versions", None, b"[" * 100_000, 400, 400),
        ("POST", "/subjects/s/versions", None, b"x" * (MAX_BODY_BYTES + 1), 413, 413),
        ("POST", "/subjects/s/versions", {}, None, 422, 42201),
        ("POST", "/subjects/s/versions", {"schema": 5}, None, 422, 42201),
        ("POST", "/subjects/s/versions", {"schema": "{nope"}, None, 422, 42201),
        ("POST", "/subjects/s/versions", {"schema": '{"type": "zzz"}'}, None, 422, 42201),
        ("POST", "/subjects/s/versions", {"schema": "[" * 5000 + "]" * 5000}, None, 422, 42201),
        ("POST", "/subjects/s/versions", {"schema": RECORD, "schemaType": "XML"}, None, 422, 42201),
        (
            "POST",
            "/subjects/s/versions",
            {"schema": '{"type": 12}', "schemaType": "JSON"},
            None,
            422,
            42201,
        ),
        (
            "POST",
            "/subjects/s/versions",
            {"schema": "message {", "schemaType": "PROTOBUF"},
            None,
            422,
            42201,
        ),
        (
            "POST",
            "/subjects/s/versions",
            {"schema": RECORD, "references": [{"name": "x", "subject": "nope", "version": 1}]},
            None,
            422,
            42201,
        ),
        ("POST", "/subjects/s/versions", {"schema": RECORD, "references": "x"}, None, 422, 42201),
        ("POST", "/subjects/s/versions", {"schema": RECORD, "id": 7}, None, 422, 42205),
        ("POST", "/subjects/" + "a" * 300 + "/versions", {"schema": RECORD}, None, 422, 42208),
        ("POST", "/subjects/a%01b/versions", {"schema": RECORD}, None, 422, 42208),
        ("GET", "/schemas/ids/abc", None, None, 404, 40403),
        ("GET", "/schemas/ids/99999999999999999999", None, None, 404, 40403),
        ("GET", "/schemas/ids/2", None, None, 404, 40403),
        ("GET", "/subjects/nope/versions", None, None, 404, 40401),
        ("GET", "/subjects/s/versions/2", None, None, 404, 40402),
        ("GET", "/subjects/s/versions/0", None, None, 422, 42202),
        ("GET", "/subjects/s/versions/-2", None, None, 422, 42202),
        ("GET", "/subjects/s/versions/1e3", None, None, 422, 42202),
        ("PUT", "/config", {"compatibility": "SIDEWAYS"}, None, 422, 42203),
        ("PUT", "/config/s", {"compatibility": ["FULL"]}, None, 422, 42203),
        ("PUT", "/mode", {"mode": "SOMETIMES"}, None, 422, 42204),
        ("GET", "/config/s", None, None, 404, 40408),
        ("GET", "/mode/s", None, None, 404, 40409),
        ("GET", "/no/such/route", None, None, 404, 404),
        ("PATCH", "/subjects", None, None, 405, 405),
        ("DELETE", "/subjects/s/versions/1?permanent=true", None, None, 404, 40407),
    ]
    for method, path, body, raw, want_status, want_code in cases:
        status, answer = await call(client, method, path, body, raw)
        assert (status, answer.get("error_code")) == (want_status, want_code), (
            method,
            path[:60],
            answer,
        )
        assert isinstance(answer["message"], str)
    # Nothing changed: the one schema is still there, under its id.
    assert await call(client, "GET", "/subjects") == (200, ["s"])
    status, body = await call(client, "GET", "/schemas/ids/1")
    assert json.loads(body["schema"]) == json.loads(RECORD)


async def test_soft_then_hard_delete_follow_confluents_rules(
    client: TestClient[Any, Any],
) -> None:
    await call(client, "PUT", "/config/s", {"compatibility": "NONE"})
    for field in ("a", "b"):
        schema = json.dumps(
            {"type": "record", "name": "R", "fields": [{"name": field, "type": "int"}]}
        )
        assert (await call(client, "POST", "/subjects/s/versions", {"schema": schema}))[0] == 200
    assert await call(client, "DELETE", "/subjects/s/versions/1") == (200, 1)
    _, body = await call(client, "DELETE", "/subjects/s/versions/1")
    assert body["error_code"] == 40406
    assert await call(client, "GET", "/subjects/s/versions") == (200, [2])
    assert await call(client, "GET", "/subjects/s/versions?deleted=true") == (200, [1, 2])
    _, body = await call(client, "DELETE", "/subjects/s?permanent=true")
    assert body["error_code"] == 40405
    assert await call(client, "DELETE", "/subjects/s/versions/1?permanent=true") == (200, 1)
    assert await call(client, "DELETE", "/subjects/s") == (200, [2])
    _status, body = await call(client, "DELETE", "/subjects/s")
    assert body["error_code"] == 40404
    assert await call(client, "GET", "/subjects?deleted=true") == (200, ["s"])
    assert await call(client, "DELETE", "/subjects/s?permanent=true") == (200, [2])
    assert await call(client, "GET", "/subjects?deleted=true") == (200, [])
    # Schemas stay readable by id: records written with them stay decodable.
    assert (await call(client, "GET", "/schemas/ids/1"))[0] == 200
    _, body = await call(client, "GET", "/config/s")
    assert body["error_code"] == 40408


async def test_the_remote_lookup_reads_a_served_registry(tmp_path: Path) -> None:
    metadata = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    server = RegistryServer(metadata)
    port = await server.start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    lookup = RemoteLookup(url)
    try:
        async with aiohttp.ClientSession() as session:
            dep = {
                "schema": 'syntax = "proto3"; message D { int32 x = 1; }',
                "schemaType": "PROTOBUF",
            }
            async with session.post(f"{url}/subjects/d.proto/versions", json=dep) as answer:
                dep_id = (await answer.json(content_type=None))["id"]
            main = {
                "schema": 'syntax = "proto3"; import "d.proto"; message M { D d = 1; }',
                "schemaType": "PROTOBUF",
                "references": [{"name": "d.proto", "subject": "d.proto", "version": 1}],
            }
            async with session.post(f"{url}/subjects/m-value/versions", json=main) as answer:
                main_id = (await answer.json(content_type=None))["id"]
            # Registered as text, the schema is served as base64 of its descriptor to the
            # readers that ask for that form, as Confluent's Python deserializers do.
            latest = f"{url}/subjects/m-value/versions/latest?format=serialized"
            async with session.get(latest) as answer:
                proto = decode_serialized((await answer.json(content_type=None))["schema"])
            assert [m.name for m in proto.message_type] == ["M"]
            assert list(proto.dependency) == ["d.proto"]
        found = await lookup.by_id(main_id)
        assert found is not None
        assert found.schema_type is SchemaType.PROTOBUF
        assert found.references == (SchemaReference("d.proto", "d.proto", 1),)
        referenced = await lookup.by_reference(found.references[0])
        assert referenced is not None
        assert referenced.id == dep_id
        assert await lookup.by_id(main_id + 100) is None
        assert await lookup.by_reference(SchemaReference("x", "nope", 1)) is None
        # The same schema through the store, as decoders on the brokers read it.
        assert await StoreLookup(metadata).by_id(main_id) == found
    finally:
        await lookup.close()
        await server.close()
        await metadata.close()
    gone = RemoteLookup(url)
    with pytest.raises(UnavailableError):
        await gone.by_id(1)  # nothing listens there any more
    await gone.close()


async def test_the_remote_lookup_sends_its_basic_auth() -> None:
    seen: list[str | None] = []

    async def schema(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"schema": '"string"'})

    app = web.Application()
    app.router.add_get("/schemas/ids/{id}", schema)
    async with TestServer(app) as server:
        lookup = RemoteLookup(str(server.make_url("")), "alice:s3cret")
        found = await lookup.by_id(3)
        await lookup.close()
    assert found == RegisteredSchema(3, SchemaType.AVRO, '"string"')
    assert seen == ["Basic " + base64.b64encode(b"alice:s3cret").decode()]


async def test_basic_auth_against_sasl_users_with_the_confluent_client(tmp_path: Path) -> None:
    metadata = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    users = UserStore(metadata)
    await users.put("alice", ScramCredential.from_password("SCRAM-SHA-256", "s3cret", 4096))

    async def check(user: str, password: str) -> bool:
        credentials = await users.credentials(user)
        return any([await asyncio.to_thread(c.matches, password) for c in credentials])

    server = RegistryServer(metadata, check)
    url = f"http://127.0.0.1:{await server.start('127.0.0.1', 0)}"

    def register(user_info: str | None) -> int:
        conf = {"url": url} | ({"basic.auth.user.info": user_info} if user_info else {})
        client = SchemaRegistryClient(conf)
        return int(client.register_schema("s", Schema('"string"', "AVRO")))

    try:
        assert await asyncio.to_thread(register, "alice:s3cret") == 1
        for wrong in ("alice:nope", "bob:s3cret", None):
            with pytest.raises(SchemaRegistryError) as refused:
                await asyncio.to_thread(register, wrong)
            assert (refused.value.http_status_code, refused.value.error_code) == (401, 401)
        async with aiohttp.ClientSession() as session:
            for header in (
                "Basic !!!",
                "Basic " + "A" * 5000,
                "Bearer x",
                "Basic " + base64.b64encode(b"x" * 2000).decode(),
            ):
                async with session.get(
                    f"{url}/subjects", headers={"Authorization": header}
                ) as answer:
                    assert answer.status == 401
    finally:
        await server.close()
        await metadata.close()
