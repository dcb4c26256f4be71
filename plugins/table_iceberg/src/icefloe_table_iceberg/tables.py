"""The Iceberg side of "one copy, two views": blocking pyiceberg calls, one job per function.

Everything here runs on the adapter's thread pool. What each constraint is for:

- The table location is the Delta table root, holding the data files; Iceberg's metadata goes
  to ``write.metadata.path``, *outside* that root, or a Delta vacuum would delete it.
- ``gc.enabled=false``: only Icefloe deletes data files (another format may still use them).
- Icefloe's Parquet files carry no field ids, so the table has a name mapping
  (``schema.name-mapping.default``); every reader (pyiceberg, DuckDB, Spark, Trino) resolves
  columns through it.
- The partition value of an added file is derived from the statistics of its ``partition``
  column (min = max), which is why that column stays inside the file; a time-partitioned
  table's hour or day from those of ``timestamp``.
- The commit sequence is a table property written in the *same* metadata commit as the
  snapshot, so "files registered" and "sequence recorded" are one atomic fact; the snapshot
  summary carries it too, for people reading the history.
- ``commit.retry.num-retries=0``: pyiceberg retries a commit that lost a race by replaying the
  snapshot on top of the winner's — with the same files, if the winner was a retry of the same
  Icefloe commit. A lost race must surface instead, so that the caller re-reads the sequence.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog as PyIcebergCatalog
from pyiceberg.exceptions import (
    NamespaceAlreadyExistsError,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationError,
)
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile as IcebergDataFile
from pyiceberg.manifest import DataFileContent, ManifestContent
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.transforms import DayTransform, HourTransform, Transform

from icefloe.errors import AlreadyExistsError, ConflictError, NotFoundError
from icefloe.ports.table import CommitResult, DataFile, TableInfo, TableSpec, TimePartition
from icefloe.storage.row_schema import TIMESTAMP
from icefloe_table_iceberg.errors import translated

SEQUENCE_PROPERTY: Final = "icefloe.commit-sequence"
"""Table property (and snapshot summary key) holding the last applied Icefloe commit."""

FORMAT_VERSION: Final = "2"
"""v2: what pyiceberg 0.12 writes by default and what DuckDB 1.4's iceberg extension reads."""


def table_properties(spec: TableSpec) -> dict[str, str]:
    """The properties a topic table is created with (the name mapping is added later)."""
    return {
        **spec.properties,
        "format-version": FORMAT_VERSION,
        "write.metadata.path": spec.metadata_location,
        "gc.enabled": "false",
        "commit.retry.num-retries": "0",
        # Each commit writes a metadata.json; keep the newest 100, not every one ever written.
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "100",
    }


def ensure_table(catalog: PyIcebergCatalog, spec: TableSpec) -> TableInfo:
    """Create the topic table if absent (race-safe) and check an existing one matches."""
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(spec.namespace)
    try:
        table = catalog.load_table(spec.identifier)
    except NoSuchTableError:
        table = _create(catalog, spec)
    _check_matches(table, spec)
    return table_info(table, spec)


def _create(catalog: PyIcebergCatalog, spec: TableSpec) -> Table:
    # One create transaction: schema, partition spec and properties land in the first
    # metadata.json, so no reader ever sees an unpartitioned or unmapped table.
    txn = catalog.create_table_transaction(
        spec.identifier,
        schema=spec.schema,  # required (non-null) Arrow fields become required Iceberg fields
        location=spec.location,
        properties=table_properties(spec),
    )
    with txn.update_spec() as update:
        update.add_identity(spec.partition_column)
        if spec.time_partition is not None:
            update.add_field(TIMESTAMP, _transform(spec), spec.time_partition.column)
    mapping = txn.table_metadata.schema().name_mapping
    txn.set_properties({"schema.name-mapping.default": mapping.model_dump_json()})
    try:
        return txn.commit_transaction()
    except TableAlreadyExistsError:
        return catalog.load_table(spec.identifier)  # another process created it meanwhile


def _check_matches(table: Table, spec: TableSpec) -> None:
    if normal_url(table.location()) != normal_url(spec.location):
        raise ConflictError(
            f"Iceberg table {spec.identifier} exists at {table.location()}, not at {spec.location}"
        )
    schema = table.schema()
    found = [(schema.find_column_name(f.source_id), str(f.transform)) for f in table.spec().fields]
    wanted = [(spec.partition_column, "identity")]
    if spec.time_partition is not None:
        wanted.append((TIMESTAMP, str(spec.time_partition)))
    if found != wanted:
        described = ", ".join(f"{transform}({column})" for column, transform in wanted)
        raise ConflictError(
            f"Iceberg table {spec.identifier} is partitioned by {table.spec()}, not by {described}"
        )


def _transform(spec: TableSpec) -> Transform[Any, Any]:
    return HourTransform() if spec.time_partition is TimePartition.HOUR else DayTransform()


def table_info(table: Table, spec: TableSpec) -> TableInfo:
    return TableInfo(spec.identifier, spec.location, normal_url(table.metadata_location))


def load(catalog: PyIcebergCatalog, spec: TableSpec) -> Table:
    try:
        return catalog.load_table(spec.identifier)
    except NoSuchTableError as exc:
        raise NotFoundError(f"Iceberg table {spec.identifier} does not exist") from exc


def last_sequence(metadata: TableMetadata) -> int:
    return int(metadata.properties.get(SEQUENCE_PROPERTY, "0"))


def version_of(table: Table) -> str:
    snapshot = table.current_snapshot()
    return str(snapshot.snapshot_id) if snapshot else ""


def commit(
    table: Table, spec: TableSpec, sequence: int, added: list[DataFile], removed: list[str]
) -> CommitResult:
    """Register ``added`` and unregister ``removed`` in one snapshot, unless already applied.

    The sequence check reads the same metadata the commit is based on, and the commit asserts
    that the branch head has not moved (pyiceberg's ``AssertRefSnapshotId`` requirement): if
    another writer committed in between, the catalog refuses and the caller retries from a
    fresh read. So a sequence is applied at most once even with concurrent committers.
    """
    if sequence <= last_sequence(table.metadata):
        return CommitResult(applied=False, version=version_of(table))
    root = spec.location.rstrip("/")
    add_urls = [f"{root}/{f.path}" for f in added]
    remove_urls = [f"{root}/{path}" for path in removed]
    live = _live_data_files(table, set(add_urls) | set(remove_urls))
    if already := sorted(url for url in add_urls if url in live):
        raise AlreadyExistsError(f"{spec.identifier} already references {', '.join(already)}")
    if missing := sorted(url for url in remove_urls if url not in live):
        raise NotFoundError(f"{spec.identifier} does not reference {', '.join(missing)}")

    marker = {SEQUENCE_PROPERTY: str(sequence)}
    with table.transaction() as txn:
        txn.set_properties(marker)
        _evolve(txn, table.io, add_urls)
        if added or removed:
            # Each read of it applies the transaction's updates to a deep copy of the metadata.
            metadata = txn.table_metadata
            snapshot = txn.update_snapshot(snapshot_properties=marker)
            # Public API: Transaction.update_snapshot() → producer. merge_append keeps the
            # manifest count bounded for the common add-only commit; overwrite is the producer
            # that takes explicit deletes (delete_data_file) next to appends, in one snapshot.
            with snapshot.overwrite() if removed else snapshot.merge_append() as files:
                for url, data_file in zip(add_urls, added, strict=True):
                    files.append_data_file(_describe(table.io, metadata, url, data_file))
                for url in remove_urls:
                    files.delete_data_file(live[url])
    table.refresh()
    return CommitResult(applied=True, version=version_of(table))


def _evolve(txn: Transaction, io: FileIO, urls: list[str]) -> None:
    """Widen the table's schema, in the commit's own transaction, to cover the columns of the
    files at ``urls``: a schema-backed topic's typed columns appear, and gain fields, as its
    schemas evolve. ``union_by_name`` adds optional columns and nested fields (and their
    name mapping) only; a type the table cannot take is refused, and the commit with it.
    Files of one schema (a run's, usually) are unioned once: each union copies the metadata."""
    unioned: set[pa.Schema] = set()
    for url in urls:
        with io.new_input(url).open() as stream:
            schema = pq.read_schema(stream)
        if schema in unioned:
            continue
        unioned.add(schema)
        try:
            with txn.update_schema() as update:
                update.union_by_name(schema)
        except ValidationError as exc:
            raise ValueError(f"{url} does not fit the table's columns: {exc}") from exc


class _QuietStatistics:
    """Icefloe writes Parquet statistics only for the columns readers filter on (partition,
    offset, timestamp); pyiceberg warns once per other column of every row group it describes,
    which would flood the broker's log. Its module logger is raised above warnings while any
    thread describes files: a filter would still build each record first, which took 40 %
    of a commit's describing."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._lock = threading.Lock()
        self._describing = 0
        self._level = logging.NOTSET

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        with self._lock:
            if self._describing == 0:
                self._level = self._logger.level
                self._logger.setLevel(logging.ERROR)
            self._describing += 1
        try:
            yield
        finally:
            with self._lock:
                self._describing -= 1
                if self._describing == 0:
                    self._logger.setLevel(self._level)


_quiet_about_missing_statistics = _QuietStatistics(logging.getLogger("pyiceberg.io.pyarrow"))


def _describe(
    io: FileIO, metadata: TableMetadata, url: str, data_file: DataFile
) -> IcebergDataFile:
    """An Iceberg data-file entry for an existing Parquet file, from its footer (not rewritten).

    ``parquet_file_to_data_file`` is what ``Transaction.add_files`` uses: it reads the footer
    for column statistics and derives the partition from the partition column's min/max.
    """
    with _quiet_about_missing_statistics():
        try:
            described = parquet_file_to_data_file(io, metadata, url)
        except ValueError as exc:  # rows of several partitions (hours, days) in one file
            raise ValueError(f"{url} does not fit one partition of the table: {exc}") from exc
    found = [
        described.record_count,
        *(described.partition[i] for i in range(len(described.partition))),
    ]
    expected = [data_file.record_count, data_file.partition]
    if data_file.time_bucket is not None:
        expected.append(data_file.time_bucket)
    if found != expected:
        raise ValueError(
            f"{url} holds {found[0]} rows of partition {found[1:]}, "
            f"but the commit says {expected[0]} rows of partition {expected[1:]}"
        )
    return described


def _live_entries(table: Table) -> Iterator[tuple[IcebergDataFile, int]]:
    """(data file, id of the snapshot that added it) for every file of the current snapshot."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return
    for manifest in snapshot.manifests(table.io):
        if manifest.content != ManifestContent.DATA:
            continue
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            if entry.data_file.content == DataFileContent.DATA:
                yield entry.data_file, entry.snapshot_id or 0


def _live_data_files(table: Table, urls: set[str]) -> dict[str, IcebergDataFile]:
    return {f.file_path: f for f, _ in _live_entries(table) if f.file_path in urls}


def list_files(table: Table, spec: TableSpec) -> list[DataFile]:
    """The data files of the current snapshot, by path relative to the table root.

    Iceberg records no file modification time: ``modified_ms`` is 0 ("unknown").
    """
    prefix = spec.location.rstrip("/") + "/"
    files = [
        DataFile(
            path=f.file_path.removeprefix(prefix),
            size=f.file_size_in_bytes,
            record_count=f.record_count,
            partition=int(f.partition[0]),
            modified_ms=0,
            time_bucket=int(f.partition[1]) if len(f.partition) > 1 else None,
        )
        for f, _ in _live_entries(table)
    ]
    return sorted(files, key=lambda f: f.path)


def expire(table: Table, older_than_ms: int) -> None:
    """Drop snapshots older than ``older_than_ms`` from the metadata; no file is deleted.

    pyiceberg's expiry only edits metadata (and the table's ``gc.enabled=false`` tells every
    other engine not to delete data files either). Branch heads are never expired.
    """
    head_ids = {ref.snapshot_id for ref in table.metadata.refs.values()}
    if not any(
        s.timestamp_ms < older_than_ms and s.snapshot_id not in head_ids
        for s in table.metadata.snapshots
    ):
        return  # nothing to do: do not write a metadata.json for it
    cutoff = datetime.datetime.fromtimestamp(older_than_ms / 1000, tz=datetime.UTC)
    with table.maintenance.expire_snapshots() as expiry:
        expiry.older_than(cutoff)


def drop(catalog: PyIcebergCatalog, spec: TableSpec) -> None:
    """Remove the table from the catalog (no purge: its data files are Icefloe's)."""
    with contextlib.suppress(NoSuchTableError):
        catalog.drop_table(spec.identifier)


def normal_url(url: str) -> str:
    """``file:/x`` (Java's spelling, e.g. from a REST catalog) as ``file:///x``; else ``url``."""
    if url.startswith("file:/") and not url.startswith("file://"):
        return "file://" + url[len("file:") :]
    return url


def merged(*layers: Mapping[str, str]) -> dict[str, str]:
    """Later layers win: Icefloe's defaults, then what the operator configured."""
    result: dict[str, str] = {}
    for layer in layers:
        result.update(layer)
    return result


class IcebergTables:
    """The blocking operations of one pyiceberg catalog, with SDK errors translated."""

    def __init__(self, catalog: PyIcebergCatalog) -> None:
        self.catalog = catalog

    def ensure_table(self, spec: TableSpec) -> TableInfo:
        with translated(spec):
            return ensure_table(self.catalog, spec)

    def commit(
        self, spec: TableSpec, sequence: int, added: list[DataFile], removed: list[str]
    ) -> CommitResult:
        with translated(spec):
            return commit(load(self.catalog, spec), spec, sequence, added, removed)

    def last_commit(self, spec: TableSpec) -> int:
        with translated(spec):
            return last_sequence(load(self.catalog, spec).metadata)

    def files(self, spec: TableSpec) -> list[DataFile]:
        with translated(spec):
            return list_files(load(self.catalog, spec), spec)

    def expire(self, spec: TableSpec, older_than_ms: int) -> None:
        with translated(spec):
            expire(load(self.catalog, spec), older_than_ms)

    def drop(self, spec: TableSpec) -> None:
        with translated(spec):
            drop(self.catalog, spec)

    def close(self) -> None:
        engine = getattr(self.catalog, "engine", None)  # SqlCatalog's SQLAlchemy engine
        if engine is not None:
            engine.dispose()
