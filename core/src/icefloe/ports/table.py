"""The TableFormat port: one lakehouse table format (Iceberg, Delta, …) for topic tables.

Several catalogs are active at once and register the *same* Parquet files: Icefloe writes each
data file once, under the table root, and every enabled format references it in place.

Contract (executable form: ``icefloe.testing.table_contract``):

- ``ensure_table(spec)`` creates the table if absent and is a no-op if it exists with the same
  spec; it returns where the table lives.
- ``commit(spec, sequence, added, removed)`` adds and removes data files in one atomic commit of
  the format. ``sequence`` is Icefloe's commit number for the table: commits are applied in
  increasing order, and a commit whose sequence is not greater than ``last_commit(spec)`` is a
  no-op that returns ``applied=False``. So a retried commit never registers a file twice.
- ``files(spec)`` lists the data files the current table state references; ``last_commit`` the
  highest sequence applied.
- Data files are never deleted by a catalog: only Icefloe deletes them, once no format and no
  index entry references them. ``expire(spec, older_than)`` drops old table history
  (snapshots/versions) but no data file.
- ``drop(spec)`` removes the table's metadata; idempotent.
- A table with a ``time_partition`` is partitioned by the Kafka partition *and* the hour or day
  of the record timestamp. Every row of a data file then falls in the file's ``time_bucket``;
  a file whose rows do not, or whose ``time_bucket`` is missing, is refused (``ValueError``).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from icefloe.ports.base import Port, PortKind

if TYPE_CHECKING:
    import pyarrow as pa


class TimePartition(enum.StrEnum):
    """A time transform of the record timestamp that partitions a table."""

    HOUR = "hour"
    DAY = "day"

    @property
    def millis(self) -> int:
        return 3_600_000 if self is TimePartition.HOUR else 86_400_000

    @property
    def column(self) -> str:
        """The partition column of formats that need one (Delta): ``timestamp_hour`` holds
        the hour as a UTC timestamp, ``timestamp_day`` the day as a date."""
        return f"timestamp_{self.value}"

    def bucket(self, timestamp_ms: int) -> int:
        """Hours (days) since the epoch of ``timestamp_ms``, as Iceberg's transform counts."""
        return timestamp_ms // self.millis


@dataclass(frozen=True)
class TableSpec:
    """A topic's table.

    Attributes:
        namespace: The catalog namespace (database) of Icefloe's tables.
        name: Table name, derived from the topic.
        location: URL of the table root; data files live at
            ``<location>/partition=<p>/<file>.parquet``.
        schema: Arrow schema of the rows (:data:`icefloe.storage.row_schema.ROW_SCHEMA`).
        metadata_location: URL of a folder outside the table root for formats that keep their
            metadata apart from the data (Iceberg), so that another format's maintenance
            (a Delta vacuum) never deletes it.
        partition_column: Column whose identity partitions the table.
        properties: Extra table properties.
        time_partition: Whether the table is also partitioned by the hour or day of the
            ``timestamp`` column.
    """

    namespace: str
    name: str
    location: str
    schema: pa.Schema
    metadata_location: str
    partition_column: str = "partition"
    properties: Mapping[str, str] = field(default_factory=dict)
    time_partition: TimePartition | None = None

    @property
    def identifier(self) -> str:
        return f"{self.namespace}.{self.name}"


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet data file, by its path relative to the table root (``partition=3/x.parquet``)."""

    path: str
    size: int
    record_count: int
    partition: int
    modified_ms: int
    time_bucket: int | None = None
    """The hour (day) since the epoch of every row's timestamp, in a time-partitioned table."""


@dataclass(frozen=True, slots=True)
class CommitResult:
    applied: bool
    """``False`` when the sequence was already committed (the call was a no-op)."""
    version: str
    """The format's snapshot id or table version after the call."""


@dataclass(frozen=True, slots=True)
class TableInfo:
    identifier: str
    location: str
    metadata_location: str | None
    """Where an engine finds the table (Iceberg ``metadata.json``), if the format has one."""


class TableFormat(Port):
    """One table format; see the module docstring for the contract."""

    kind: ClassVar[PortKind] = PortKind.TABLE

    async def ensure_table(self, spec: TableSpec) -> TableInfo:
        return await self._ensure_table(spec)

    async def commit(
        self,
        spec: TableSpec,
        sequence: int,
        added: Sequence[DataFile],
        removed: Sequence[str] = (),
    ) -> CommitResult:
        if sequence <= 0:
            raise ValueError(f"commit sequence must be positive, got {sequence}")
        paths = [f.path for f in added]
        if len(set(paths)) != len(paths):
            raise ValueError("a commit may not add the same file twice")
        if set(paths) & set(removed):
            raise ValueError("a commit may not add and remove the same file")
        timed = spec.time_partition is not None
        if any((f.time_bucket is not None) != timed for f in added):
            raise ValueError(
                f"every file added to {spec.identifier} needs a time bucket"
                if timed
                else f"{spec.identifier} is not partitioned by time: files take no time bucket"
            )
        return await self._commit(spec, sequence, list(added), list(removed))

    async def last_commit(self, spec: TableSpec) -> int:
        return await self._last_commit(spec)

    async def files(self, spec: TableSpec) -> list[DataFile]:
        return await self._files(spec)

    async def expire(self, spec: TableSpec, older_than_ms: int) -> None:
        await self._expire(spec, older_than_ms)

    async def drop(self, spec: TableSpec) -> None:
        await self._drop(spec)

    @abc.abstractmethod
    async def _ensure_table(self, spec: TableSpec) -> TableInfo: ...

    @abc.abstractmethod
    async def _commit(
        self, spec: TableSpec, sequence: int, added: list[DataFile], removed: list[str]
    ) -> CommitResult: ...

    @abc.abstractmethod
    async def _last_commit(self, spec: TableSpec) -> int: ...

    @abc.abstractmethod
    async def _files(self, spec: TableSpec) -> list[DataFile]: ...

    @abc.abstractmethod
    async def _expire(self, spec: TableSpec, older_than_ms: int) -> None: ...

    @abc.abstractmethod
    async def _drop(self, spec: TableSpec) -> None: ...
