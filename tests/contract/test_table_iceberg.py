"""The Iceberg table format runs the table contract on its embedded SQLite catalog and on a
real Iceberg REST catalog (the reference fixture server), plus what only Iceberg has."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table.update.schema import UpdateSchema

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableFormat, TableSpec
from icefloe.testing.contract import open_backend
from icefloe.testing.table_contract import TableFormatContract
from tests.support.iceberg_rest import iceberg_rest
from tests.support.postgres import postgres


def pyiceberg_table(table_format: TableFormat, spec: TableSpec) -> Any:
    """The table as pyiceberg sees it, through the adapter's own catalog connection."""
    return table_format._tables.catalog.load_table(spec.identifier)  # type: ignore[attr-defined]


class TestIcebergTableFormat(TableFormatContract):
    backend_name = "iceberg"

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        return pyiceberg_table(table_format, spec).scan().to_arrow()

    # --- Iceberg only -------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_table_is_made_for_sharing_its_files(
        self, table_format: TableFormat, table: TableSpec
    ) -> None:
        iceberg = pyiceberg_table(table_format, table)
        properties = iceberg.properties
        assert properties["gc.enabled"] == "false"
        assert properties["write.metadata.path"] == table.metadata_location
        assert properties["commit.retry.num-retries"] == "0"
        mapping = json.loads(properties["schema.name-mapping.default"])
        assert {field["names"][0] for field in mapping} == set(table.schema.names)
        assert [str(f.transform) for f in iceberg.spec().fields] == ["identity"]
        assert iceberg.schema().find_field("offset").required
        assert not iceberg.schema().find_field("key").required

    @pytest.mark.asyncio
    async def test_metadata_lives_outside_the_table_root(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        await table_format.commit(table, 1, [await self.write_file(store, table, 0, range(3))])
        info = await table_format.ensure_table(table)
        assert info.metadata_location is not None
        assert info.metadata_location.startswith(table.metadata_location + "/")
        assert info.metadata_location.endswith(".metadata.json")
        assert not info.metadata_location.startswith(table.location + "/")

    @pytest.mark.asyncio
    async def test_snapshot_summary_carries_the_sequence(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        await table_format.commit(table, 12, [await self.write_file(store, table, 0, range(3))])
        snapshot = pyiceberg_table(table_format, table).current_snapshot()
        assert snapshot.summary["icefloe.commit-sequence"] == "12"

    @pytest.mark.asyncio
    async def test_a_commit_logs_nothing_about_columns_without_statistics(
        self,
        table_format: TableFormat,
        store: ObjectStore,
        table: TableSpec,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        logger = logging.getLogger("pyiceberg.io.pyarrow")
        with caplog.at_level(logging.WARNING):
            level = logger.level
            file = await self.write_file(store, table, 0, range(3))
            await table_format.commit(table, 1, [file])
            assert logger.level == level  # raised only while describing
            logger.warning("statistics missing, a warning from outside a commit")
        warnings = [r.getMessage() for r in caplog.records if r.name == logger.name]
        assert warnings == ["statistics missing, a warning from outside a commit"]

    @pytest.mark.asyncio
    async def test_a_commit_unions_each_schema_of_its_files_into_the_table_once(
        self,
        table_format: TableFormat,
        store: ObjectStore,
        table: TableSpec,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        unions: list[pa.Schema] = []
        union_by_name = UpdateSchema.union_by_name

        def counted(update: UpdateSchema, new_schema: Any, *args: Any) -> UpdateSchema:
            unions.append(new_schema)
            return union_by_name(update, new_schema, *args)

        monkeypatch.setattr(UpdateSchema, "union_by_name", counted)
        files = [await self.write_file(store, table, p, range(p * 10, p * 10 + 3)) for p in (0, 1)]

        await table_format.commit(table, 1, files)

        assert len(unions) == 1  # both files have the same columns
        assert pyiceberg_table(table_format, table).scan().to_arrow().num_rows == 6

    @pytest.mark.asyncio
    async def test_expire_drops_old_snapshots(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        for sequence in (1, 2, 3):
            await table_format.commit(
                table, sequence, [await self.write_file(store, table, 0, [sequence])]
            )
        assert len(pyiceberg_table(table_format, table).snapshots()) == 3
        await table_format.expire(table, 0)  # nothing is that old
        assert len(pyiceberg_table(table_format, table).snapshots()) == 3
        await table_format.expire(table, int(time.time() * 1000) + 60_000)
        assert len(pyiceberg_table(table_format, table).snapshots()) == 1  # the head stays

    @pytest.mark.asyncio
    async def test_default_catalog_is_sqlite_in_the_data_dir(
        self, table_format: TableFormat, table: TableSpec, tmp_path: Path
    ) -> None:
        assert (tmp_path / "iceberg-catalog.db").is_file()


class TestIcebergTableFormatOnRest(TableFormatContract):
    """The same contract through a real REST catalog: the server writes the metadata."""

    backend_name = "iceberg"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"catalog": "rest", "uri": iceberg_rest().url}

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        return pyiceberg_table(table_format, spec).scan().to_arrow()

    def test_rest_options_need_a_uri(self) -> None:
        from icefloe_table_iceberg.options import IcebergTableFormatOptions
        from pydantic import ValidationError

        with pytest.raises(ValidationError, match="uri"):
            IcebergTableFormatOptions.model_validate({"catalog": "rest"})


class TestIcebergTableFormatOnPostgres(TableFormatContract):
    """The same contract with the SQL catalog on PostgreSQL instead of SQLite."""

    backend_name = "iceberg"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"uri": postgres().sqlalchemy_url, "name": f"icefloe_{unique}"}

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        return pyiceberg_table(table_format, spec).scan().to_arrow()

    @pytest.mark.asyncio
    async def test_catalog_rows_live_in_postgres(
        self, table_format: TableFormat, table: TableSpec, options: dict[str, Any]
    ) -> None:
        import sqlalchemy

        engine = sqlalchemy.create_engine(postgres().sqlalchemy_url)
        try:
            with engine.connect() as connection:
                found = connection.execute(
                    sqlalchemy.text(
                        "SELECT table_namespace, table_name FROM iceberg_tables "
                        "WHERE catalog_name = :name"
                    ),
                    {"name": options["name"]},
                ).all()
        finally:
            engine.dispose()
        assert [tuple(row) for row in found] == [(table.namespace, table.name)]

    @pytest.mark.asyncio
    async def test_a_missing_driver_is_named_with_the_install_hint(
        self, store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import sys

        from icefloe.errors import ConfigError

        monkeypatch.setitem(sys.modules, "psycopg2", None)  # import psycopg2 now fails
        with pytest.raises(ConfigError, match=r"icefloe-table-iceberg\[postgres\]"):
            await self.open_table_format(
                tmp_path, {"uri": postgres().sqlalchemy_url, "name": "missing_driver"}, store
            )


async def test_pyiceberg_runs_one_worker_thread_once_the_plugin_is_open(tmp_path: Path) -> None:
    """pyiceberg's overwrite shares a stateful manifest evaluator between worker threads; with
    several, a file to delete can be missed under load and the commit refused."""
    from pyiceberg.utils.concurrent import ExecutorFactory

    store = await open_backend(PortKind.OBJECT_STORE, "local", tmp_path, {"root": str(tmp_path)})
    table_format = await open_backend(PortKind.TABLE, "iceberg", tmp_path, {}, object_store=store)
    try:
        assert ExecutorFactory.max_workers() == 1
    finally:
        await table_format.close()
        await store.close()
