"""The registry's keys: ids claimed by compare-and-set across stores, lookups by id and by
reference, on the embedded metadata store, etcd and Oxia (two stores on one file or namespace
act as two brokers)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from icefloe.config import load_config, resolve_one
from icefloe.errors import ConflictError
from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import MetadataStore
from icefloe.schemas.lookup import RemoteLookup, StoreLookup, open_lookup
from icefloe.schemas.model import SchemaReference, SchemaType
from icefloe.schemas.store import SchemaStore
from tests.support.metadata_servers import shared_etcd, shared_oxia


async def _open(path: Path, backend: str) -> MetadataStore:
    """A store of ``backend``; two opened on one ``path`` share their keys, as two brokers'."""
    if backend == "sqlite":
        options: dict[str, Any] = {}
    else:
        server = shared_oxia() if backend == "oxia" else shared_etcd()
        namespace = f"registry-{path.name}"
        options = (
            server.oxia_options(namespace) if backend == "oxia" else server.etcd_options(namespace)
        )
    config = load_config(env={}, overrides={"metadata": {"backend": backend, backend: options}})
    return await resolve_one(config, MetadataStore).open(OpenContext(data_dir=path))


@pytest.fixture(params=["sqlite", "etcd", "oxia"])
async def stores(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[MetadataStore, MetadataStore]]:
    first = await _open(tmp_path, request.param)
    second = await _open(tmp_path, request.param)
    yield first, second
    await first.close()
    await second.close()


async def test_concurrent_claims_give_one_id_per_schema_and_one_schema_per_id(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    a, b = SchemaStore(stores[0]), SchemaStore(stores[1])
    texts = [f'{{"type":"fixed","name":"F{i}","size":{i + 1}}}' for i in range(8)]
    claims = [
        store.claim(f"print-{i}", SchemaType.AVRO, text, ())
        for i, text in enumerate(texts)
        for store in (a, b, a)
    ]
    ids = await asyncio.gather(*claims)
    per_schema = [set(ids[3 * i : 3 * i + 3]) for i in range(len(texts))]
    assert all(len(found) == 1 for found in per_schema), per_schema
    distinct = [found.pop() for found in per_schema]
    assert len(set(distinct)) == len(texts)
    for i, schema_id in enumerate(distinct):
        schema = await b.schema(schema_id)
        assert schema is not None
        assert schema.schema == texts[i]
    # The losers' records are gone: every stored id is one schema's.
    assert sorted([i async for i in a.schema_ids()]) == sorted(distinct)


async def test_concurrent_versions_of_a_subject_never_share_a_number(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    a, b = SchemaStore(stores[0]), SchemaStore(stores[1])

    async def add(store: SchemaStore, schema_id: int) -> None:
        while True:
            versions = await store.versions("s")
            try:
                await store.add_version("s", len(versions) + 1, schema_id)
                return
            except ConflictError:
                continue  # the other store took that number: read again

    await asyncio.gather(*(add(a if i % 2 else b, 100 + i) for i in range(6)))
    versions = await a.versions("s")
    assert [v.version for v in versions] == [1, 2, 3, 4, 5, 6]
    assert sorted(v.schema_id for v in versions) == list(range(100, 106))


async def test_lookup_by_id_and_by_reference(stores: tuple[MetadataStore, MetadataStore]) -> None:
    store = SchemaStore(stores[0])
    schema_id = await store.claim("p", SchemaType.PROTOBUF, 'syntax = "proto3";', ())
    await store.add_version("dep.proto", 1, schema_id)
    lookup = open_lookup(load_config(env={}), stores[1])
    assert isinstance(lookup, StoreLookup)
    found = await lookup.by_id(schema_id)
    assert found is not None
    assert found.schema_type is SchemaType.PROTOBUF
    assert await lookup.by_reference(SchemaReference("dep.proto", "dep.proto", 1)) == found
    assert await lookup.by_reference(SchemaReference("dep.proto", "dep.proto", 2)) is None
    assert await lookup.by_id(schema_id + 1) is None
    assert await lookup.by_id(-5) is None
    await lookup.close()


def test_an_external_url_gives_the_remote_lookup(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    config = load_config(
        env={
            "ICEFLOE_SCHEMA_REGISTRY__URL": "http://registry.example:8081/",
            "ICEFLOE_SCHEMA_REGISTRY__BASIC_AUTH_USER_INFO": "u:p",
        }
    )
    assert config.schema_registry.url == "http://registry.example:8081"
    assert not config.schema_registry.served
    assert isinstance(open_lookup(config, stores[0]), RemoteLookup)


async def test_an_imported_id_is_never_given_to_another_schema(
    stores: tuple[MetadataStore, MetadataStore],
) -> None:
    store = SchemaStore(stores[0])
    assert await store.claim("imported", SchemaType.AVRO, '"int"', (), wanted_id=2) == 2
    assert await store.claim("imported", SchemaType.AVRO, '"int"', (), wanted_id=2) == 2
    with pytest.raises(ConflictError):
        await store.claim("other", SchemaType.AVRO, '"long"', (), wanted_id=2)
    with pytest.raises(ConflictError):
        await store.claim("imported", SchemaType.AVRO, '"int"', (), wanted_id=3)
    fresh = [await store.claim(f"new-{i}", SchemaType.AVRO, f'"n{i}"', ()) for i in range(3)]
    assert 2 not in fresh
    assert len(set(fresh)) == 3
