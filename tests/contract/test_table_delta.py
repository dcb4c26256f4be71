"""The Delta table format runs the TableFormat contract, plus what only Delta has."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableFormat, TableSpec
from icefloe.tables import layout
from icefloe.testing.table_contract import TableFormatContract


def delta_table(spec: TableSpec, storage_options: dict[str, str] | None = None) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(spec.location, storage_options=storage_options)


def delta_rows(spec: TableSpec, storage_options: dict[str, str] | None = None) -> pa.Table:
    """The table's rows through delta-rs's own query engine.

    Not ``to_pyarrow_table()``: with delta-rs 1.6 a process that called it may abort at exit.
    """
    from deltalake import QueryBuilder

    query = QueryBuilder().register("t", delta_table(spec, storage_options))
    return pa.table(query.execute('SELECT partition, "offset", key, value FROM t').read_all())


def log_entries(spec: TableSpec, store_root: Path) -> list[dict[str, Any]]:
    """Every action of every JSON commit of the table's log, in order."""
    log = store_root / layout.table_root(spec.identifier) / "_delta_log"
    return [
        json.loads(line)
        for commit in sorted(log.glob("*.json"))
        for line in commit.read_text().splitlines()
    ]


class TestDeltaTableFormat(TableFormatContract):
    backend_name = "delta"

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        return delta_rows(spec)

    # --- Delta only ---------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_commit_writes_relative_adds_with_stats_and_the_app_transaction(
        self,
        table_format: TableFormat,
        store: ObjectStore,
        table: TableSpec,
        tmp_path: Path,
        unique: str,
    ) -> None:
        a = await self.write_file(store, table, 2, range(10, 20))
        await table_format.commit(table, 9, [a])
        entries = log_entries(table, tmp_path / unique / "objects")
        (add,) = [e["add"] for e in entries if "add" in e]
        (txn,) = [e["txn"] for e in entries if "txn" in e]
        assert (add["path"], add["size"], add["partitionValues"]) == (
            a.path,
            a.size,
            {"partition": "2"},
        )
        assert add["modificationTime"] == a.modified_ms
        stats = json.loads(add["stats"])
        assert stats["numRecords"] == 10
        assert (stats["minValues"]["offset"], stats["maxValues"]["offset"]) == (10, 19)
        assert stats["minValues"]["timestamp"] <= stats["maxValues"]["timestamp"]
        assert stats["nullCount"]["key"] == 2  # offsets 14 and 19 have null keys
        assert (txn["appId"], txn["version"]) == ("icefloe", 9)

    @pytest.mark.asyncio
    async def test_remove_actions_name_the_removed_file(
        self,
        table_format: TableFormat,
        store: ObjectStore,
        table: TableSpec,
        tmp_path: Path,
        unique: str,
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        b = await self.write_file(store, table, 0, range(3))
        await table_format.commit(table, 1, [a])
        await table_format.commit(table, 2, [b], [a.path])
        entries = log_entries(table, tmp_path / unique / "objects")
        (remove,) = [e["remove"] for e in entries if "remove" in e]
        assert (remove["path"], remove["dataChange"], remove["size"]) == (a.path, True, a.size)

    @pytest.mark.asyncio
    async def test_expire_checkpoints_and_keeps_the_sequence(
        self,
        table_format: TableFormat,
        store: ObjectStore,
        table: TableSpec,
        tmp_path: Path,
        unique: str,
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        await table_format.commit(table, 5, [a])
        await table_format.expire(table, int(time.time() * 1000))
        log = tmp_path / unique / "objects" / layout.table_root(table.identifier)
        assert list((log / "_delta_log").glob("*.checkpoint.parquet"))
        assert delta_table(table).transaction_version("icefloe") == 5

    @pytest.mark.asyncio
    async def test_expire_drops_no_log_version_younger_than_the_retention(
        self, store: ObjectStore, spec: TableSpec, tmp_path: Path, unique: str
    ) -> None:
        table_format = await self.open_table_format(
            tmp_path, {"log_retention": "interval 0 seconds"}, store
        )
        try:
            await table_format.ensure_table(spec)
            for sequence in (1, 2, 3):
                await table_format.commit(
                    spec, sequence, [await self.write_file(store, spec, 0, [sequence])]
                )
            log = tmp_path / unique / "objects" / layout.table_root(spec.identifier)
            versions = sorted((log / "_delta_log").glob("*.json"))
            await table_format.expire(spec, 0)  # older than 1970: nothing may go
            assert sorted((log / "_delta_log").glob("*.json")) == versions
            await table_format.expire(spec, int(time.time() * 1000) + 1000)  # everything may go
            assert len(sorted((log / "_delta_log").glob("*.json"))) < len(versions)
            assert await self.rows(table_format, spec) == self.expected((0, [1, 2, 3]))
            assert await table_format.last_commit(spec) == 3
        finally:
            await table_format.close()

    @pytest.mark.asyncio
    async def test_a_bad_log_retention_is_refused_at_open(
        self, store: ObjectStore, tmp_path: Path
    ) -> None:
        with pytest.raises(ValueError, match="interval"):
            await self.open_table_format(
                tmp_path, {"log_retention": "interval 3 fortnights"}, store
            )
