"""Apache Spark reads both tables of a topic — Iceberg through the SQL catalog Icefloe commits
to, Delta by its location — on the local file system and on S3 (MinIO), configured
from nothing but what the object store plugin hands engines, and sees exactly the produced
records.

One Spark (local mode, in a process of its own) serves the whole module; it starts while the
first topic is produced. Without Java, the Spark jars or a server the tests fail, naming
``scripts/install-servers``: they never skip.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from icefloe_table_iceberg.table_format import WAREHOUSE_KEY

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.testing.contract import open_backend
from tests.integration.test_backends_end_to_end import environment
from tests.integration.test_tables_on_object_stores import (
    COMPACT_AT_ONCE,
    RECORDS,
    consume_all,
    produce,
    wait_until_compacted,
)
from tests.support.broker import start_icefloe
from tests.support.object_servers import SERVERS
from tests.support.spark_readers import SparkReader

STORES = ["local", "minio"]
"""S3 on MinIO only, as in the table contract suite: moto speaks the same API."""


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkReader]:
    reader = SparkReader()
    try:
        yield reader
    finally:
        reader.close()


def store_of(server: str) -> tuple[str, dict[str, Any]]:
    """The object-store backend and options reaching ``server`` (``local``: the default)."""
    if server == "local":
        return "local", {}
    backend, options_of = SERVERS[server]
    return backend, options_of(f"spark-{uuid.uuid4().hex[:8]}")


async def store_settings(
    backend: str, options: dict[str, Any], data_dir: Path
) -> tuple[dict[str, str], dict[str, str], str]:
    """What the store plugin hands engines, and the Iceberg catalog's warehouse on it."""
    store = await open_backend(PortKind.OBJECT_STORE, backend, data_dir, options)
    assert isinstance(store, ObjectStore)
    try:
        return store.engine_options(), store.iceberg_properties(), store.url(WAREHOUSE_KEY)
    finally:
        await store.close()


@pytest.mark.parametrize("server", STORES)
def test_spark_reads_both_tables(tmp_path: Path, server: str, spark: SparkReader) -> None:
    backend, options = store_of(server)
    env = environment("object_store", backend, options) if options else {}
    env["ICEFLOE_TABLE__FORMATS"] = json.dumps(["iceberg", "delta"])
    running = start_icefloe(tmp_path / "data", env={**env, **COMPACT_AT_ONCE})
    try:
        produce(running.bootstrap)
        produced = consume_all(running.bootstrap)
        assert len(produced) == RECORDS
        described = {row["format"]: row for row in wait_until_compacted(running, env)}
    finally:
        assert running.stop() == 0
    assert set(described) == {"iceberg", "delta"}

    engine_options, iceberg_properties, warehouse = asyncio.run(
        store_settings(backend, options, running.data_dir)
    )
    iceberg = described["iceberg"]
    catalog_file = running.data_dir / "iceberg-catalog.db"
    iceberg_rows = spark.iceberg_rows(
        iceberg["identifier"], catalog_file, warehouse, iceberg_properties
    )
    assert iceberg_rows == produced, f"Spark {spark.version} read other Iceberg rows on {server}"
    delta_rows = spark.delta_rows(described["delta"]["location"], engine_options)
    assert delta_rows == produced, f"Spark {spark.version} read other Delta rows on {server}"
