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
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from icefloe.ports.base import Port, PortKind

if TYPE_CHECKING:
    import pyarrow as pa


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
    """

    namespace: str
    name: str
    location: str
    schema: pa.Schema
    metadata_location: str
    partition_column: str = "partition"
    properties: Mapping[str, str] = field(default_factory=dict)

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
