"""The ObjectStore contract on GCS (fake-gcs-server), and the object-store WAL layered on it."""

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
from tests.support.object_servers import BUCKET, fake_gcs, gcs_client


@pytest.fixture(autouse=True, scope="module")
def server() -> None:
    """fake-gcs-server, started once per test process: if it cannot start, every test errors."""
    fake_gcs()


def gcs_options(unique: str) -> dict[str, Any]:
    return {
        "bucket": BUCKET,
        "prefix": unique,
        "endpoint": fake_gcs().url,
        "anonymous": True,
        "initial_backoff": 0.05,
    }


class TestGCSObjectStore(ObjectStoreContract):
    backend_name = "gcs"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return gcs_options(unique)

    async def backdoor_read(self, store: ObjectStore, key: str) -> bytes | None:
        prefix = store._folder  # type: ignore[attr-defined]
        return await asyncio.to_thread(read_object, prefix + key)


class TestObjectWALOnGCS(WALContract):
    backend_name = "object"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"prefix": "wal"}

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore | None:
        store = await open_backend(PortKind.OBJECT_STORE, "gcs", workdir, gcs_options(unique))
        assert isinstance(store, ObjectStore)
        return store


def read_object(name: str) -> bytes | None:
    blob = gcs_client(fake_gcs().url).bucket(BUCKET).get_blob(name)
    return None if blob is None else bytes(blob.download_as_bytes())
