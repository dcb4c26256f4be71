"""The Delta side of "one copy, two views": blocking delta-rs calls, one job per method.

Everything here runs on the adapter's thread pool. What each constraint is for:

- The Delta table root is the Iceberg table location and holds the data files; the log
  (``_delta_log/``) references them by path *relative* to the root, as the protocol wants.
- The partition column stays inside the Parquet files (Iceberg needs it there); Delta takes
  partition values from the log's ``partitionValues``, and its readers ignore the in-file
  copy, so both agree on the same value.
- Idempotency: each commit carries the app transaction ``(icefloe, sequence)``. delta-rs only
  *records* app transaction versions and never compares them, so :meth:`DeltaTables.commit`
  reads the current one and skips a sequence not above it. The write is based on the version
  that read came from, with no commit retries: if another writer committed in between, the
  commit fails instead of being rebased on top (which would apply the same sequence twice).
- Data files are never vacuumed: only Icefloe deletes them (Iceberg may still use them).
- A time-partitioned table has one more partition column, ``timestamp_hour`` (a UTC
  timestamp) or ``timestamp_day`` (a date), which exists in the log only: Delta has no
  partition transforms, so the value is written as a column of its own.
"""

from __future__ import annotations

import datetime
import re
import time
from collections.abc import Sequence
from typing import Final

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction

from icefloe.errors import AlreadyExistsError, ConflictError, NotFoundError
from icefloe.ports.table import CommitResult, DataFile, TableInfo, TableSpec, TimePartition
from icefloe_table_delta.errors import translated

APP_ID: Final = "icefloe"
"""The app transaction id whose version is Icefloe's commit sequence."""
SEQUENCE_METADATA: Final = "icefloe.commit-sequence"
"""Commit-info key repeating the sequence, for people reading the history."""
RETENTION_PROPERTY: Final = "delta.logRetentionDuration"
DELTA_DEFAULT_RETENTION: Final = "interval 30 days"
EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

_UNIT_MS: Final = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}


class DeltaTables:
    """The blocking operations on Delta tables, with SDK errors translated."""

    def __init__(self, storage_options: dict[str, str], log_retention: str) -> None:
        """
        Args:
            storage_options: delta-rs ``storage_options`` to reach the object store (may be
                empty: a ``file://`` URL needs none).
            log_retention: ``delta.logRetentionDuration`` of new tables.
        """
        self._storage = storage_options or None
        self._log_retention = log_retention

    def _open(self, spec: TableSpec) -> DeltaTable:
        return DeltaTable(spec.location, storage_options=self._storage)

    def ensure_table(self, spec: TableSpec) -> TableInfo:
        with translated(spec):
            if not DeltaTable.is_deltatable(spec.location, self._storage):
                try:
                    DeltaTable.create(
                        spec.location,
                        schema=_schema(spec),  # non-null Arrow fields become non-nullable
                        mode="ignore",
                        partition_by=_partition_columns(spec),
                        name=spec.name,
                        configuration={**spec.properties, RETENTION_PROPERTY: self._log_retention},
                        storage_options=self._storage,
                    )
                except DeltaError:
                    # Lost a creation race: fine if the winner created the same table.
                    if not DeltaTable.is_deltatable(spec.location, self._storage):
                        raise
            table = self._open(spec)
            partitioning = table.metadata().partition_columns
            if partitioning != _partition_columns(spec):
                raise ConflictError(
                    f"Delta table {spec.location} is partitioned by {partitioning}, "
                    f"not by {_partition_columns(spec)}"
                )
            return TableInfo(spec.identifier, spec.location, None)

    def commit(
        self,
        spec: TableSpec,
        sequence: int,
        added: list[DataFile],
        removed: list[str],
        stats: dict[str, str],
        schemas: Sequence[pa.Schema] = (),
    ) -> CommitResult:
        """One write transaction with the AddActions and RemoveActions, unless already applied.

        Args:
            stats: Delta ``stats`` JSON of each added file, by path.
            schemas: The added files' schemas: the table's is widened to cover them first.
        """
        with translated(spec):
            table = self._open(spec)
            if sequence <= (table.transaction_version(APP_ID) or 0):
                return CommitResult(applied=False, version=str(table.version()))
            live = _live_files(table, spec)
            if already := sorted(f.path for f in added if f.path in live):
                raise AlreadyExistsError(f"{spec.location} already references {', '.join(already)}")
            if missing := sorted(path for path in removed if path not in live):
                raise NotFoundError(f"{spec.location} does not reference {', '.join(missing)}")
            if self._evolve(table, spec, schemas):
                table = self._open(spec)
                if sequence <= (table.transaction_version(APP_ID) or 0):
                    return CommitResult(applied=False, version=str(table.version()))
                live = _live_files(table, spec)
            now_ms = int(time.time() * 1000)
            actions: list[AddAction | RemoveAction] = [
                AddAction(
                    path=f.path,
                    size=f.size,
                    partition_values=_partition_values(spec, f),
                    modification_time=f.modified_ms,
                    data_change=True,
                    stats=stats[f.path],
                )
                for f in added
            ]
            actions += [
                RemoveAction(
                    path=path,
                    data_change=True,
                    deletion_timestamp=now_ms,
                    size=live[path].size,
                    partition_values=_partition_values(spec, live[path]),
                )
                for path in removed
            ]
            table.create_write_transaction(
                actions,
                mode="append",
                schema=table.schema(),  # the table's own: a commit never alters the schema
                partition_by=_partition_columns(spec),
                commit_properties=CommitProperties(
                    custom_metadata={SEQUENCE_METADATA: sequence},
                    max_commit_retries=0,
                    app_transactions=[Transaction(APP_ID, sequence, now_ms)],
                ),
            )
            table.update_incremental()
            return CommitResult(applied=True, version=str(table.version()))

    def _evolve(self, table: DeltaTable, spec: TableSpec, schemas: Sequence[pa.Schema]) -> bool:
        """Widen the table's schema to cover ``schemas`` (a schema-backed topic's typed columns
        appear, and gain fields, as its schemas evolve); whether it changed.

        delta-rs writes no schema change with the AddActions of a write transaction, so the
        change is a commit of its own before them: a metadata-only append of no rows with
        ``schema_mode="merge"``. Should the data commit then fail, the table has columns no
        file fills yet (read as null), and the retried commit finds it widened already.
        """
        current = pa.schema(table.schema().to_arrow())
        try:
            merged = pa.unify_schemas([current, *schemas], promote_options="permissive")
        except (pa.ArrowException, TypeError) as exc:
            raise ValueError(f"a file does not fit the columns of {spec.location}: {exc}") from exc
        if set(merged.names) == set(current.names) and all(
            merged.field(name).type == current.field(name).type for name in current.names
        ):
            return False
        write_deltalake(
            spec.location,
            merged.empty_table(),
            mode="append",
            schema_mode="merge",
            partition_by=_partition_columns(spec),
            storage_options=self._storage,
            commit_properties=CommitProperties(max_commit_retries=0),
        )
        return True

    def last_commit(self, spec: TableSpec) -> int:
        with translated(spec):
            return self._open(spec).transaction_version(APP_ID) or 0

    def files(self, spec: TableSpec) -> list[DataFile]:
        with translated(spec):
            return sorted(_live_files(self._open(spec), spec).values(), key=lambda f: f.path)

    def expire(self, spec: TableSpec, older_than_ms: int) -> None:
        """Checkpoint, then drop log versions older than the table's retention, if allowed.

        The checkpoint is what bounds commit cost: a table loads from its newest checkpoint.
        delta-rs deletes old log versions by the table's ``delta.logRetentionDuration`` (no
        other cutoff can be passed), so the cleanup runs only when that deletes nothing newer
        than ``older_than_ms``. Data files are untouched (no vacuum).
        """
        with translated(spec):
            table = self._open(spec)
            table.create_checkpoint()
            configured = table.metadata().configuration.get(RETENTION_PROPERTY)
            retention_ms = interval_ms(configured or DELTA_DEFAULT_RETENTION)
            if older_than_ms >= int(time.time() * 1000) - retention_ms:
                table.cleanup_metadata()


def _schema(spec: TableSpec) -> pa.Schema:
    """The table's schema: the rows', plus the time partition column if there is one."""
    unit = spec.time_partition
    if unit is None:
        return spec.schema
    kind = pa.timestamp("us", tz="UTC") if unit is TimePartition.HOUR else pa.date32()
    return spec.schema.append(pa.field(unit.column, kind, nullable=False))


def _partition_columns(spec: TableSpec) -> list[str]:
    unit = spec.time_partition
    return [spec.partition_column] + ([unit.column] if unit is not None else [])


def _partition_values(spec: TableSpec, data_file: DataFile) -> dict[str, str | None]:
    """A file's Delta ``partitionValues`` (timestamps and dates as the protocol writes them)."""
    values: dict[str, str | None] = {spec.partition_column: str(data_file.partition)}
    unit = spec.time_partition
    if unit is not None:
        assert data_file.time_bucket is not None  # the port checks it
        start = EPOCH + datetime.timedelta(milliseconds=data_file.time_bucket * unit.millis)
        text = start.strftime("%Y-%m-%d %H:%M:%S.%f" if unit is TimePartition.HOUR else "%Y-%m-%d")
        values[unit.column] = text
    return values


def _time_bucket(spec: TableSpec, value: datetime.date | None) -> int | None:
    """The bucket of a partition value read back from the log (a datetime or a date)."""
    unit = spec.time_partition
    if unit is None or value is None:
        return None
    if not isinstance(value, datetime.datetime):
        value = datetime.datetime.combine(value, datetime.time(), datetime.UTC)
    return unit.bucket((value - EPOCH) // datetime.timedelta(milliseconds=1))


def _live_files(table: DeltaTable, spec: TableSpec) -> dict[str, DataFile]:
    actions = pa.table(table.get_add_actions(flatten=True))
    partitions = actions.column(f"partition.{spec.partition_column}").to_pylist()
    unit = spec.time_partition
    buckets = (
        actions.column(f"partition.{unit.column}").to_pylist()
        if unit is not None
        else [None] * actions.num_rows
    )
    return {
        path: DataFile(
            path, size, records or 0, int(partition), modified, _time_bucket(spec, bucket)
        )
        for path, size, records, partition, modified, bucket in zip(
            actions.column("path").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            actions.column("num_records").to_pylist(),
            partitions,
            actions.column("modification_time").to_pylist(),
            buckets,
            strict=True,
        )
    }


def interval_ms(interval: str) -> int:
    """Milliseconds of a Delta interval such as ``"interval 7 days"``."""
    match = re.fullmatch(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", interval.lower())
    if match is None or match.group(2) not in _UNIT_MS:
        raise ValueError(f"{interval!r} is not a Delta interval like 'interval 7 days'")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]
