"""The ObjectStore contract on S3 (moto server), and the object-store WAL layered on it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.testing.contract import open_backend
from icefloe.testing.object_store_contract import ObjectStoreContract
from icefloe.testing.wal_contract import WALContract
from tests.support.object_servers import BUCKET, MOTO_CREDENTIALS, moto, s3_client


@pytest.fixture(autouse=True, scope="module")
def server() -> None:
    """moto, started once per test process: if it cannot start, every test here errors."""
    moto()


def s3_options(unique: str) -> dict[str, Any]:
    return {
        "bucket": BUCKET,
        "prefix": unique,
        "endpoint_url": moto().url,
        "region": "us-east-1",
        "addressing_style": "path",
        **MOTO_CREDENTIALS,
    }


class TestS3ObjectStore(ObjectStoreContract):
    backend_name = "s3"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return s3_options(unique)

    async def backdoor_read(self, store: ObjectStore, key: str) -> bytes | None:
        prefix = store._folder  # type: ignore[attr-defined]
        return await asyncio.to_thread(read_object, prefix + key)


class TestObjectWALOnS3(WALContract):
    backend_name = "object"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"prefix": "wal"}

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore | None:
        store = await open_backend(PortKind.OBJECT_STORE, "s3", workdir, s3_options(unique))
        assert isinstance(store, ObjectStore)
        return store


def read_object(name: str) -> bytes | None:
    client = s3_client(moto().url)
    try:
        return bytes(client.get_object(Bucket=BUCKET, Key=name)["Body"].read())
    except client.exceptions.NoSuchKey:
        return None
