"""The Iceberg adapter: the TableFormat port on pyiceberg, with a SQL or a REST catalog.

How each promise of the port is kept (details in :mod:`icefloe_table_iceberg.tables`):

- *Files registered in place*: each added Parquet file is described from its footer and
  appended to a snapshot as is — never rewritten or copied (what ``add_files`` does).
- *Add and remove atomically*: one snapshot, produced by ``Transaction.update_snapshot()``
  (``overwrite()`` when files are removed, ``merge_append()`` otherwise).
- *Idempotent by sequence*: the table property ``icefloe.commit-sequence`` is set in the same
  metadata commit as the snapshot; a commit whose sequence is not above it is a no-op.
- *No data file deleted*: ``gc.enabled=false``; expiry and drop edit metadata only.

pyiceberg is synchronous: calls run on a bounded thread pool, and commits to one table from
this process are serialised (so they never race each other into a conflict).
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from icefloe.adapters.blocking import BlockingSdk
from icefloe.errors import ConfigError
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import CommitResult, DataFile, TableFormat, TableInfo, TableSpec
from icefloe_table_iceberg.options import DEFAULT_SQLITE_FILE, IcebergTableFormatOptions

if TYPE_CHECKING:
    from icefloe_table_iceberg.tables import IcebergTables

WAREHOUSE_KEY = "iceberg-warehouse"
"""Object-store folder given to a SQL catalog as its warehouse (tables set their location)."""


class IcebergTableFormat(TableFormat):
    """Topic tables in an Iceberg catalog; see the module docstring."""

    options_model = IcebergTableFormatOptions

    def __init__(
        self, tables: IcebergTables, object_store: ObjectStore, options: IcebergTableFormatOptions
    ) -> None:
        """Wrap a pyiceberg catalog; :meth:`open` is the usual way in."""
        self._tables = tables
        self._store = object_store
        # Only ``run`` is used: IcebergTables translates pyiceberg's errors itself, on the
        # worker thread, where it knows which table failed.
        self._sdk = BlockingSdk(
            "the iceberg catalog", threads=options.max_workers, thread_name_prefix="icefloe-iceberg"
        )
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def open(cls, options: IcebergTableFormatOptions, context: OpenContext) -> Self:
        if context.object_store is None:
            raise ConfigError(
                "the iceberg table backend keeps its files in the object store: "
                "configure [object_store] before [table]"
            )
        store = context.object_store
        tables = await asyncio.to_thread(_connect, options, context.data_dir, store)
        return cls(tables, store, options)

    async def close(self) -> None:
        if not self._sdk.closed:
            # The catalog's connections are released once no running call uses them any more.
            await self._sdk.close()
            await asyncio.to_thread(self._tables.close)

    # --- the port's primitives ----------------------------------------------------------------

    async def _ensure_table(self, spec: TableSpec) -> TableInfo:
        async with self._lock(spec):
            return await self._sdk.run(self._tables.ensure_table, spec)

    async def _commit(
        self, spec: TableSpec, sequence: int, added: list[DataFile], removed: list[str]
    ) -> CommitResult:
        async with self._lock(spec):
            return await self._sdk.run(self._tables.commit, spec, sequence, added, removed)

    async def _last_commit(self, spec: TableSpec) -> int:
        return await self._sdk.run(self._tables.last_commit, spec)

    async def _files(self, spec: TableSpec) -> list[DataFile]:
        return await self._sdk.run(self._tables.files, spec)

    async def _expire(self, spec: TableSpec, older_than_ms: int) -> None:
        async with self._lock(spec):
            await self._sdk.run(self._tables.expire, spec, older_than_ms)

    async def _drop(self, spec: TableSpec) -> None:
        async with self._lock(spec):
            await self._sdk.run(self._tables.drop, spec)

    # --- helpers ------------------------------------------------------------------------------

    def _lock(self, spec: TableSpec) -> asyncio.Lock:
        return self._locks.setdefault(spec.identifier, asyncio.Lock())


def _connect(
    options: IcebergTableFormatOptions, data_dir: Path, store: ObjectStore
) -> IcebergTables:
    """Build the pyiceberg catalog (imports the SDK: called from ``open`` only)."""
    # pyiceberg 0.12 shares one stateful manifest evaluator between its worker threads when an
    # overwrite looks for the files it deletes, so under load a manifest can be skipped and the
    # commit refused ("Missing required files to delete"). One worker avoids the race; an
    # operator's own PYICEBERG_MAX_WORKERS still wins.
    os.environ.setdefault("PYICEBERG_MAX_WORKERS", "1")
    from icefloe_table_iceberg.tables import IcebergTables, merged

    io = store.iceberg_properties()
    if options.catalog == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        rest: dict[str, str] = {"uri": str(options.uri)}
        if options.warehouse:
            rest["warehouse"] = options.warehouse
        if options.credential is not None:
            rest["credential"] = options.credential.get_secret_value()
        if options.token is not None:
            rest["token"] = options.token.get_secret_value()
        return IcebergTables(RestCatalog(options.name, **merged(io, rest, options.properties)))

    from pyiceberg.catalog.sql import SqlCatalog

    data_dir.mkdir(parents=True, exist_ok=True)
    sql = {
        "uri": options.uri or f"sqlite:///{data_dir / DEFAULT_SQLITE_FILE}",
        "warehouse": options.warehouse or store.url(WAREHOUSE_KEY),
    }
    properties = merged(io, sql, options.properties)
    try:
        return IcebergTables(_sql_catalog(SqlCatalog, options.name, properties))
    except ModuleNotFoundError as exc:
        # SQLAlchemy imports the database's driver only when the engine is made.
        extra = "[postgres]" if sql["uri"].startswith("postgresql") else ""
        raise ConfigError(
            f"[table.iceberg] uri needs the database driver {exc.name!r}: "
            f"pip install 'icefloe-table-iceberg{extra}'" + ("" if extra else f" {exc.name}")
        ) from exc


def _sql_catalog(factory: Any, name: str, properties: dict[str, str]) -> Any:
    """A ``SqlCatalog``, tolerating another process creating its tables at the same moment.

    pyiceberg creates the catalog tables when they are missing; brokers starting together on
    one SQLite file race on that, and the loser's CREATE TABLE fails. Opening again finds them.
    """
    from sqlalchemy.exc import OperationalError

    attempt = 1
    while True:
        try:
            return factory(name, **properties)
        except OperationalError as exc:
            if "already exists" not in str(exc) or attempt == 3:
                raise
        attempt += 1
        time.sleep(0.1)
