"""The Delta adapter: the TableFormat port on delta-rs (``deltalake``), no server needed.

How each promise of the port is kept (details in :mod:`icefloe_table_delta.tables`):

- *Files registered in place*: one write transaction of ``AddAction``s naming the existing
  Parquet files by relative path, with size, modification time, partition value and
  statistics read from the footer (one ranged read of each file's tail) — never rewritten.
- *Add and remove atomically*: the same transaction carries the ``RemoveAction``s.
- *Idempotent by sequence*: the transaction carries the app transaction ``(icefloe,
  sequence)``, and a sequence not above the table's current one is skipped (delta-rs itself
  does not check it).
- *No data file deleted*: ``expire`` checkpoints and cleans the log, never vacuums; ``drop``
  deletes ``_delta_log/`` only.

delta-rs's Python API is synchronous: calls run on a bounded thread pool, and commits to one
table from this process are serialised.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final, Self

from icefloe.adapters.blocking import BlockingSdk
from icefloe.errors import ConfigError, NotFoundError, StorageError
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import CommitResult, DataFile, TableFormat, TableInfo, TableSpec
from icefloe.storage.row_schema import TIMESTAMP
from icefloe_table_delta.options import DeltaTableFormatOptions

if TYPE_CHECKING:
    from icefloe_table_delta.tables import DeltaTables

DELTA_LOG: Final = "_delta_log"


class DeltaTableFormat(TableFormat):
    """Topic tables as Delta tables in the object store; see the module docstring."""

    options_model = DeltaTableFormatOptions

    def __init__(
        self, tables: DeltaTables, object_store: ObjectStore, options: DeltaTableFormatOptions
    ) -> None:
        """Wrap the delta-rs operations; :meth:`open` is the usual way in."""
        self._tables = tables
        self._store = object_store
        # Only ``run`` is used: DeltaTables translates delta-rs's errors itself, on the worker
        # thread, where it knows which table failed.
        self._sdk = BlockingSdk(
            "the delta catalog", threads=options.max_workers, thread_name_prefix="icefloe-delta"
        )
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    async def open(cls, options: DeltaTableFormatOptions, context: OpenContext) -> Self:
        if context.object_store is None:
            raise ConfigError(
                "the delta table backend keeps its tables in the object store: "
                "configure [object_store] before [table]"
            )
        from icefloe_table_delta.tables import DeltaTables, interval_ms

        interval_ms(options.log_retention)  # a bad interval fails at start, not at expiry
        storage = context.object_store.engine_options()
        return cls(DeltaTables(storage, options.log_retention), context.object_store, options)

    async def close(self) -> None:
        await self._sdk.close()

    # --- the port's primitives ----------------------------------------------------------------

    async def _ensure_table(self, spec: TableSpec) -> TableInfo:
        async with self._lock(spec):
            return await self._sdk.run(self._tables.ensure_table, spec)

    async def _commit(
        self, spec: TableSpec, sequence: int, added: list[DataFile], removed: list[str]
    ) -> CommitResult:
        async with self._lock(spec):
            if sequence <= await self._sdk.run(self._tables.last_commit, spec):
                # Checked before the footers are read, so a retried commit costs one log read.
                return await self._sdk.run(self._tables.commit, spec, sequence, [], [], {})
            footers = {f.path: await self._footer(spec, f) for f in added}
            stats = {path: stats_of(footer) for path, (footer, stats_of) in footers.items()}
            schemas = [footer.schema.to_arrow_schema() for footer, _ in footers.values()]
            return await self._sdk.run(
                self._tables.commit, spec, sequence, added, removed, stats, schemas
            )

    async def _last_commit(self, spec: TableSpec) -> int:
        return await self._sdk.run(self._tables.last_commit, spec)

    async def _files(self, spec: TableSpec) -> list[DataFile]:
        return await self._sdk.run(self._tables.files, spec)

    async def _expire(self, spec: TableSpec, older_than_ms: int) -> None:
        async with self._lock(spec):
            await self._sdk.run(self._tables.expire, spec, older_than_ms)

    async def _drop(self, spec: TableSpec) -> None:
        # The table *is* its log: deleting ``_delta_log/`` drops it and leaves the data files
        # (Icefloe's, maybe still Iceberg's). Newest first (``_last_checkpoint``, then versions
        # downwards), so a drop that dies half way leaves an older, still valid table that the
        # retried drop finishes.
        async with self._lock(spec):
            prefix = f"{self._key_of(spec.location)}/{DELTA_LOG}/"
            keys = [info.key async for info in self._store.list(prefix)]
            for key in sorted(keys, reverse=True):
                await self._store.delete(key)

    # --- helpers ------------------------------------------------------------------------------

    async def _footer(self, spec: TableSpec, data_file: DataFile) -> tuple[Any, Any]:
        """The file's footer, checked against ``data_file``, and the function giving its Delta
        statistics."""
        from icefloe_table_delta.stats import (
            TAIL_BYTES,
            footer_length,
            read_footer,
            stats_json,
            timestamp_range_ms,
        )

        key = f"{self._key_of(spec.location)}/{data_file.path}"
        start = max(0, data_file.size - TAIL_BYTES)
        try:
            tail = await self._store.get(key, start, data_file.size)
            needed = footer_length(tail) + 8
            if needed > len(tail):
                tail = await self._store.get(key, max(0, data_file.size - needed), data_file.size)
        except NotFoundError as exc:
            raise NotFoundError(
                f"data file {data_file.path} of {spec.location} is missing"
            ) from exc
        footer = read_footer(tail)
        if footer.num_rows != data_file.record_count:
            raise ValueError(
                f"{data_file.path} holds {footer.num_rows} rows, "
                f"but the commit says {data_file.record_count}"
            )
        unit = spec.time_partition
        if unit is not None:
            # Delta trusts partitionValues as given: check them against the rows here.
            span = timestamp_range_ms(footer, TIMESTAMP)
            buckets = {unit.bucket(ms) for ms in span} if span else set()
            if buckets != {data_file.time_bucket}:
                raise ValueError(
                    f"{data_file.path} holds rows of the {unit} partitions {sorted(buckets)}, "
                    f"but the commit says {unit} partition {data_file.time_bucket}"
                )
        return footer, stats_json

    def _key_of(self, url: str) -> str:
        """The object-store key of a URL inside the store (the table root, usually)."""
        base = self._store.url("").rstrip("/") + "/"
        if not url.startswith(base):
            raise StorageError(
                f"{url} is not inside the object store ({base}): Delta tables must live there"
            )
        return url[len(base) :].rstrip("/")

    def _lock(self, spec: TableSpec) -> asyncio.Lock:
        return self._locks.setdefault(spec.location, asyncio.Lock())
