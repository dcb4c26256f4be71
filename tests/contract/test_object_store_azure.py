"""The ObjectStore contract on Azure Blob (Azurite), and the object-store WAL layered on it."""

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
from tests.support.object_servers import (
    BUCKET,
    azure_container,
    azurite,
    azurite_connection_string,
)


@pytest.fixture(autouse=True, scope="module")
def server() -> None:
    """Azurite, started once per test process: if it cannot start, every test here errors."""
    azurite()


def azure_options(unique: str) -> dict[str, Any]:
    return {
        "container": BUCKET,
        "prefix": unique,
        "connection_string": azurite_connection_string(azurite().url),
        "initial_backoff": 0.05,
    }


class TestAzureObjectStore(ObjectStoreContract):
    backend_name = "azure"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return azure_options(unique)

    async def backdoor_read(self, store: ObjectStore, key: str) -> bytes | None:
        prefix = store._folder  # type: ignore[attr-defined]
        return await asyncio.to_thread(read_blob, prefix + key)


class TestObjectWALOnAzure(WALContract):
    backend_name = "object"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"prefix": "wal"}

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore | None:
        store = await open_backend(PortKind.OBJECT_STORE, "azure", workdir, azure_options(unique))
        assert isinstance(store, ObjectStore)
        return store


def read_blob(name: str) -> bytes | None:
    from azure.core.exceptions import ResourceNotFoundError

    try:
        return bytes(azure_container(azurite().url).download_blob(name).readall())
    except ResourceNotFoundError:
        return None
