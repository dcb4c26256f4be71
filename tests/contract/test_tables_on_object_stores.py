"""Both table formats run the table contract with their files on S3 (MinIO), GCS
(fake-gcs-server) and Azure Blob (Azurite), each reached with nothing but the object store's
own configuration: the formats take endpoint and credentials from the store plugin. Iceberg
also runs it through the REST catalog fixture on MinIO.

S3 runs on MinIO only: the formats reach moto through the same S3 client and settings, so a
second S3 server would repeat the same requests (the ObjectStore contract runs on moto)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableFormat, TableSpec
from icefloe.testing.contract import open_backend
from icefloe.testing.table_contract import TableFormatContract
from tests.contract.test_table_delta import delta_rows
from tests.contract.test_table_iceberg import pyiceberg_table
from tests.support.iceberg_rest import iceberg_rest_on_minio
from tests.support.object_servers import SERVERS

FAKE_GCS_REFUSES_XML_PUT = (
    "fake-gcs-server accepts no unsigned XML-API PUT (it answers 'invalid uploadType'), and "
    "delta-rs writes Delta log entries on GCS with exactly that; real GCS accepts it"
)


class OnObjectStore(TableFormatContract):
    """The contract with the table's files on the object-store server ``server``."""

    server: ClassVar[str]

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore:
        backend, options = SERVERS[self.server]
        store = await open_backend(
            PortKind.OBJECT_STORE, backend, workdir, options(f"tables-{unique}")
        )
        assert isinstance(store, ObjectStore)
        return store


class IcebergContract(OnObjectStore):
    backend_name = "iceberg"

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        return pyiceberg_table(table_format, spec).scan().to_arrow()


class DeltaContract(OnObjectStore):
    backend_name = "delta"

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        store = table_format._store  # type: ignore[attr-defined]
        return delta_rows(spec, store.engine_options())


class TestIcebergOnMinIO(IcebergContract):
    server = "minio"


class TestDeltaOnMinIO(DeltaContract):
    server = "minio"


class TestIcebergRestCatalogOnMinIO(IcebergContract):
    """Through the Iceberg REST catalog fixture, which writes the metadata to MinIO itself."""

    server = "minio"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"catalog": "rest", "uri": iceberg_rest_on_minio().url}


class TestIcebergOnFakeGCS(IcebergContract):
    server = "fake-gcs-server"


class TestDeltaOnFakeGCS(DeltaContract):
    server = "fake-gcs-server"
    known_gap = FAKE_GCS_REFUSES_XML_PUT
    untouched_by_gap = frozenset(
        {  # they never write a Delta log entry
            "test_drop_of_a_table_that_never_existed_is_not_an_error",
            "test_operations_on_a_missing_table_raise_not_found",
        }
    )


class TestIcebergOnAzurite(IcebergContract):
    server = "azurite"


class TestDeltaOnAzurite(DeltaContract):
    server = "azurite"
