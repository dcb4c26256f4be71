"""One copy, two views: Iceberg and Delta register the *same* Parquet files of one table root,
and independent readers — pyiceberg, delta-rs and DuckDB (its iceberg and delta extensions) —
all read exactly the rows that were written."""

from __future__ import annotations

import importlib.resources
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import DataFile, TableFormat, TableInfo, TableSpec
from icefloe.storage.row_schema import ROW_SCHEMA
from icefloe.tables import layout
from icefloe.testing.contract import open_backend
from icefloe.testing.table_contract import make_rows, parquet_bytes, rows_of

NAMESPACE, TOPIC = "shop", "orders"


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    store = await open_backend(PortKind.OBJECT_STORE, "local", tmp_path, {})
    assert isinstance(store, ObjectStore)
    yield store
    await store.close()


@pytest_asyncio.fixture
async def formats(tmp_path: Path, store: ObjectStore) -> AsyncIterator[dict[str, TableFormat]]:
    opened = {
        name: await open_backend(PortKind.TABLE, name, tmp_path, {}, object_store=store)
        for name in ("iceberg", "delta")
    }
    yield {name: c for name, c in opened.items() if isinstance(c, TableFormat)}
    for catalog in opened.values():
        await catalog.close()


@pytest.fixture
def spec(store: ObjectStore) -> TableSpec:
    return TableSpec(
        namespace=NAMESPACE,
        name=TOPIC,
        location=store.url(layout.table_root(TOPIC)),
        schema=ROW_SCHEMA,
        metadata_location=store.url(layout.iceberg_metadata_root(TOPIC)),
    )


async def write(store: ObjectStore, partition: int, offsets: range, name: str) -> DataFile:
    key = layout.data_file(TOPIC, partition, name)
    rows = make_rows(partition, offsets)
    info = await store.put(key, parquet_bytes(rows), if_absent=True)
    return DataFile(
        layout.relative_path(TOPIC, key),
        info.size,
        rows.num_rows,
        partition,
        int(info.modified * 1000),
    )


def duckdb_connection() -> Any:
    """DuckDB with the iceberg and delta extensions the PyPI packages ship (no download)."""
    import duckdb

    connection = duckdb.connect()
    connection.execute("SET autoinstall_known_extensions = false")
    platform = connection.execute("PRAGMA platform").fetchone()[0]
    folder = importlib.resources.files("duckdb_ext") / "extensions" / f"v{duckdb.__version__}"
    for extension in ("avro", "iceberg", "delta"):  # iceberg needs avro loaded first
        connection.execute(f"LOAD '{folder / platform / extension}.duckdb_extension'")
    return connection


def duckdb_rows(relation: str) -> list[tuple[Any, ...]]:
    # "offset" and "timestamp" are SQL keywords: quoted.
    sql = f'SELECT "partition", "offset", "key", "value" FROM {relation}'
    return rows_of(pa.table(duckdb_connection().execute(sql).fetch_arrow_table()))


def delta_rows(location: str) -> list[tuple[Any, ...]]:
    from deltalake import DeltaTable, QueryBuilder

    query = QueryBuilder().register("t", DeltaTable(location))
    return rows_of(
        pa.table(query.execute('SELECT partition, "offset", key, value FROM t').read_all())
    )


def iceberg_rows(catalog: TableFormat, spec: TableSpec) -> list[tuple[Any, ...]]:
    table = catalog._tables.catalog.load_table(spec.identifier)  # type: ignore[attr-defined]
    return rows_of(table.scan().to_arrow())


@pytest.mark.asyncio
async def test_both_formats_reference_the_same_files_and_every_reader_sees_the_rows(
    store: ObjectStore, formats: dict[str, TableFormat], spec: TableSpec
) -> None:
    infos: dict[str, TableInfo] = {}
    for name, catalog in formats.items():
        infos[name] = await catalog.ensure_table(spec)

    first = [await write(store, p, range(0, 50), f"c1-{p}.parquet") for p in (0, 1, 2)]
    merged = await write(store, 0, range(0, 80), "c2-0.parquet")  # rewrites 0's first file
    # Commit 1 adds three files; commit 2 replaces partition 0's file by a longer one.
    for catalog in formats.values():
        assert (await catalog.commit(spec, 1, first)).applied
        assert (await catalog.commit(spec, 2, [merged], [first[0].path])).applied
    infos["iceberg"] = await formats["iceberg"].ensure_table(spec)  # the new metadata.json

    expected = rows_of(
        pa.concat_tables(
            [make_rows(0, range(80)), make_rows(1, range(50)), make_rows(2, range(50))]
        )
    )
    listed = {name: sorted(f.path for f in await c.files(spec)) for name, c in formats.items()}
    assert listed["iceberg"] == listed["delta"] == sorted(f.path for f in [merged, *first[1:]])

    assert iceberg_rows(formats["iceberg"], spec) == expected
    assert delta_rows(spec.location) == expected
    metadata_json = infos["iceberg"].metadata_location
    assert metadata_json is not None
    assert duckdb_rows(f"iceberg_scan('{metadata_json}')") == expected
    assert duckdb_rows(f"delta_scan('{spec.location}')") == expected


@pytest.mark.asyncio
async def test_duckdb_reads_timestamps_as_written_through_both_formats(
    store: ObjectStore, formats: dict[str, TableFormat], spec: TableSpec
) -> None:
    for catalog in formats.values():
        await catalog.ensure_table(spec)
    data = await write(store, 4, range(10), "ts.parquet")
    for catalog in formats.values():
        await catalog.commit(spec, 1, [data])
    metadata_json = (await formats["iceberg"].ensure_table(spec)).metadata_location
    written = make_rows(4, range(10)).column("timestamp").cast(pa.int64()).to_pylist()
    for relation in (f"iceberg_scan('{metadata_json}')", f"delta_scan('{spec.location}')"):
        sql = f'SELECT epoch_us("timestamp") AS us FROM {relation} ORDER BY "offset"'
        assert duckdb_connection().execute(sql).fetchall() == [(us,) for us in written]


@pytest.mark.asyncio
async def test_a_format_that_missed_a_commit_catches_up_by_replaying_it(
    store: ObjectStore, formats: dict[str, TableFormat], spec: TableSpec
) -> None:
    # A crash between the two formats' commits: Iceberg has commit 1, Delta does not. The
    # committer replays commit 1 everywhere; only Delta applies it.
    for catalog in formats.values():
        await catalog.ensure_table(spec)
    data = await write(store, 0, range(5), "one.parquet")
    await formats["iceberg"].commit(spec, 1, [data])
    replayed = {name: (await c.commit(spec, 1, [data])).applied for name, c in formats.items()}
    assert replayed == {"iceberg": False, "delta": True}
    assert iceberg_rows(formats["iceberg"], spec) == delta_rows(spec.location)
    await formats["delta"].expire(spec, int(time.time() * 1000))
    assert delta_rows(spec.location) == rows_of(make_rows(0, range(5)))
