"""The TableFormat contract suite: the executable form of ``icefloe.ports.table``.

A table format opts in with a small class in its tests::

    class TestIcebergTableFormat(TableFormatContract):
        backend_name = "iceberg"

        def read_rows(self, table_format, spec):
            ...  # the format's own reader, e.g. pyiceberg's scan

The suite writes real Parquet files the way Icefloe's compaction does — the row schema, no
field ids, the partition column inside the file — into a local object store under the table
root, commits them, and checks the result through the format's own reader
(:meth:`TableFormatContract.read_rows`, the back door) and through the object store's bytes.
Override :meth:`TableFormatContract.open_object_store` to run a format on another object store.

Requires ``pip install 'icefloe[testing]'``.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytest_asyncio

from icefloe.errors import AlreadyExistsError, ConflictError, NotFoundError
from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import DataFile, TableFormat, TableSpec, TimePartition
from icefloe.storage.row_schema import PARTITION, ROW_SCHEMA
from icefloe.tables import layout
from icefloe.testing.contract import Contract, open_backend

Row = tuple[int, int, bytes | None, bytes | None]
"""What the suite compares: (partition, offset, key, value)."""

BASE_TIME = datetime.datetime(2024, 5, 1, tzinfo=datetime.UTC)


def make_rows(
    partition: int, offsets: Iterable[int], base_time: datetime.datetime = BASE_TIME
) -> pa.Table:
    """Rows of :data:`ROW_SCHEMA` for one partition, with recognisable keys and values; row
    ``o`` is stamped ``base_time`` plus ``7 * o`` microseconds."""
    offsets = list(offsets)
    n = len(offsets)
    return pa.table(
        {
            "partition": [partition] * n,
            "offset": offsets,
            "timestamp": [base_time + datetime.timedelta(microseconds=7 * o) for o in offsets],
            "timestamp_type": [0] * n,
            "key": [None if o % 5 == 4 else f"k{partition}-{o}".encode() for o in offsets],
            "value": [f"value {partition}/{o}".encode() * 3 for o in offsets],
            "headers": [[{"key": "h", "value": str(o).encode()}] for o in offsets],
            "batch_base_offset": [o - o % 4 for o in offsets],
            "batch_attributes": [0] * n,
            "producer_id": [-1] * n,
            "producer_epoch": [-1] * n,
            "base_sequence": [-1] * n,
        },
        schema=ROW_SCHEMA,
    )


def rows_of(table: pa.Table) -> list[Row]:
    """(partition, offset, key, value) of every row, sorted: equal lists mean equal data."""
    columns = [table.column(name).to_pylist() for name in (PARTITION, "offset", "key", "value")]
    return sorted(zip(*columns, strict=True), key=lambda r: (r[0], r[1]))


def parquet_bytes(rows: pa.Table) -> bytes:
    """A Parquet file as Icefloe's compaction writes it: zstd, statistics, no field ids."""
    sink = io.BytesIO()
    pq.write_table(rows, sink, compression="zstd", write_statistics=True)
    return sink.getvalue()


class TableFormatContract(Contract):
    """Generic tests every :class:`TableFormat` adapter passes; see the module docstring."""

    port_kind: ClassVar[PortKind] = PortKind.TABLE

    # --- what an implementer provides ------------------------------------------------------

    async def read_rows(self, table_format: TableFormat, spec: TableSpec) -> pa.Table:
        """Back door: every row of the table's current state, read by the format's own reader
        (pyiceberg's scan, delta-rs's query engine, …), never through the adapter.

        Every opt-in overrides this: a table format's claims are only checked by another reader.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override read_rows() with the format's own reader"
        )

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore:
        """The object store holding the tables' files: a local store by default.

        Args:
            workdir: The test's folder.
            unique: The instance's unique string.
        """
        store = await open_backend(
            PortKind.OBJECT_STORE, "local", workdir, {"root": str(workdir / unique / "objects")}
        )
        assert isinstance(store, ObjectStore)
        return store

    async def open_table_format(
        self, workdir: Path, options: dict[str, Any], object_store: ObjectStore
    ) -> TableFormat:
        table_format = await open_backend(
            self.port_kind, self.backend_name, workdir, options, object_store=object_store
        )
        assert isinstance(table_format, TableFormat)
        return table_format

    # --- fixtures ---------------------------------------------------------------------------

    @pytest.fixture
    def unique(self) -> str:
        return self.new_unique()

    @pytest.fixture
    def options(self, tmp_path: Path, unique: str) -> dict[str, Any]:
        return self.backend_options(tmp_path, unique)

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path, unique: str) -> AsyncIterator[ObjectStore]:
        store = await self.open_object_store(tmp_path, unique)
        try:
            yield store
        finally:
            await store.close()

    @pytest_asyncio.fixture
    async def table_format(
        self, tmp_path: Path, options: dict[str, Any], store: ObjectStore
    ) -> AsyncIterator[TableFormat]:
        table_format = await self.open_table_format(tmp_path, options, store)
        try:
            yield table_format
        finally:
            await table_format.close()

    @pytest.fixture
    def spec(self, store: ObjectStore, unique: str) -> TableSpec:
        namespace, name = f"ns_{unique}", "orders"
        return TableSpec(
            namespace=namespace,
            name=name,
            location=store.url(layout.table_root(f"{namespace}.{name}")),
            schema=ROW_SCHEMA,
            metadata_location=store.url(layout.iceberg_metadata_root(f"{namespace}.{name}")),
        )

    @pytest_asyncio.fixture
    async def table(self, table_format: TableFormat, spec: TableSpec) -> TableSpec:
        """``spec``, with the table created."""
        await table_format.ensure_table(spec)
        return spec

    # --- helpers ----------------------------------------------------------------------------

    async def write_file(
        self,
        store: ObjectStore,
        spec: TableSpec,
        partition: int,
        offsets: Iterable[int],
        base_time: datetime.datetime = BASE_TIME,
    ) -> DataFile:
        """Write one Parquet data file under the table root, as compaction would; in a
        time-partitioned table, with the time bucket of its first row."""
        rows = make_rows(partition, offsets, base_time)
        key = layout.data_file(spec.identifier, partition, f"{uuid.uuid4()}.parquet")
        info = await store.put(key, parquet_bytes(rows), if_absent=True)
        return DataFile(
            path=layout.relative_path(spec.identifier, key),
            size=info.size,
            record_count=rows.num_rows,
            partition=partition,
            modified_ms=int(info.modified * 1000),
            time_bucket=(
                spec.time_partition.bucket(rows.column("timestamp")[0].value // 1000)
                if spec.time_partition is not None
                else None
            ),
        )

    async def rows(self, table_format: TableFormat, spec: TableSpec) -> list[Row]:
        return rows_of(await self.read_rows(table_format, spec))

    @staticmethod
    def expected(*files: tuple[int, Iterable[int]]) -> list[Row]:
        return rows_of(pa.concat_tables([make_rows(p, offsets) for p, offsets in files]))

    @staticmethod
    async def data_objects(store: ObjectStore, spec: TableSpec) -> dict[str, bytes]:
        """Every Parquet object in the table's partition folders (where data files live), by
        key. Formats keep their own files elsewhere (``_delta_log/``, the Iceberg metadata
        root), so a data file a format rewrote or copied would show up here."""
        root = layout.table_root(spec.identifier)
        return {
            info.key: await store.get(info.key)
            async for info in store.list(f"{root}/{spec.partition_column}=")
        }

    # --- time partitioning -----------------------------------------------------------------

    @pytest.mark.asyncio
    @pytest.mark.parametrize("unit", list(TimePartition))
    async def test_a_time_partitioned_table_keeps_each_files_time_bucket(
        self, table_format: TableFormat, store: ObjectStore, spec: TableSpec, unit: TimePartition
    ) -> None:
        timed = dataclasses.replace(spec, time_partition=unit)
        await table_format.ensure_table(timed)
        later = BASE_TIME + datetime.timedelta(milliseconds=unit.millis)
        a = await self.write_file(store, timed, 0, range(3))
        b = await self.write_file(store, timed, 0, range(3, 6), later)
        c = await self.write_file(store, timed, 1, range(4), later)

        await table_format.commit(timed, 1, [a, b, c])

        bucket = unit.bucket(int(BASE_TIME.timestamp() * 1000))
        assert sorted((f.partition, f.time_bucket) for f in await table_format.files(timed)) == [
            (0, bucket),
            (0, bucket + 1),
            (1, bucket + 1),
        ]
        assert await self.rows(table_format, timed) == self.expected(
            (0, range(3)), (0, range(3, 6)), (1, range(4))
        )
        await table_format.commit(timed, 2, [], [b.path])
        assert {f.path for f in await table_format.files(timed)} == {a.path, c.path}

    @pytest.mark.asyncio
    async def test_a_file_whose_rows_span_two_hours_is_refused(
        self, table_format: TableFormat, store: ObjectStore, spec: TableSpec
    ) -> None:
        timed = dataclasses.replace(spec, time_partition=TimePartition.HOUR)
        await table_format.ensure_table(timed)
        just_before = BASE_TIME - datetime.timedelta(microseconds=10)  # rows 0-1 | rows 2-3
        straddling = await self.write_file(store, timed, 0, range(4), just_before)
        with pytest.raises(ValueError, match="partition"):
            await table_format.commit(timed, 1, [straddling])
        assert await table_format.last_commit(timed) == 0
        assert await table_format.files(timed) == []

    @pytest.mark.asyncio
    async def test_a_file_said_to_be_in_another_hour_is_refused(
        self, table_format: TableFormat, store: ObjectStore, spec: TableSpec
    ) -> None:
        timed = dataclasses.replace(spec, time_partition=TimePartition.HOUR)
        await table_format.ensure_table(timed)
        a = await self.write_file(store, timed, 0, range(3))
        assert a.time_bucket is not None
        wrong = dataclasses.replace(a, time_bucket=a.time_bucket + 1)
        with pytest.raises(ValueError, match="partition"):
            await table_format.commit(timed, 1, [wrong])
        assert await table_format.last_commit(timed) == 0

    @pytest.mark.asyncio
    async def test_files_without_a_time_bucket_are_refused_by_a_time_partitioned_table(
        self, table_format: TableFormat, store: ObjectStore, spec: TableSpec
    ) -> None:
        timed = dataclasses.replace(spec, time_partition=TimePartition.DAY)
        await table_format.ensure_table(timed)
        a = await self.write_file(store, timed, 0, range(3))
        with pytest.raises(ValueError, match="time bucket"):
            await table_format.commit(timed, 1, [dataclasses.replace(a, time_bucket=None)])

    @pytest.mark.asyncio
    async def test_ensure_table_refuses_a_table_partitioned_otherwise(
        self, table_format: TableFormat, spec: TableSpec
    ) -> None:
        await table_format.ensure_table(spec)
        with pytest.raises(ConflictError, match="partitioned by"):
            await table_format.ensure_table(
                dataclasses.replace(spec, time_partition=TimePartition.HOUR)
            )

    # --- ensure_table -----------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_ensure_table_returns_where_the_table_lives(
        self, table_format: TableFormat, spec: TableSpec
    ) -> None:
        info = await table_format.ensure_table(spec)
        assert (info.identifier, info.location) == (spec.identifier, spec.location)

    @pytest.mark.asyncio
    async def test_ensure_table_is_idempotent(
        self, table_format: TableFormat, spec: TableSpec
    ) -> None:
        first = await table_format.ensure_table(spec)
        assert await table_format.ensure_table(spec) == first

    @pytest.mark.asyncio
    async def test_new_table_is_empty_with_no_commit(
        self, table_format: TableFormat, table: TableSpec
    ) -> None:
        assert await table_format.last_commit(table) == 0
        assert await table_format.files(table) == []
        assert await self.rows(table_format, table) == []

    @pytest.mark.asyncio
    async def test_ensure_table_does_not_disturb_committed_data(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        data = await self.write_file(store, table, 0, range(3))
        await table_format.commit(table, 1, [data])
        await table_format.ensure_table(table)
        assert await table_format.last_commit(table) == 1
        assert await self.rows(table_format, table) == self.expected((0, range(3)))

    # --- commit -----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_commit_registers_exactly_the_given_files(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(0, 10))
        b = await self.write_file(store, table, 3, range(100, 105))
        await self.write_file(store, table, 0, range(10, 20))  # written, never committed
        result = await table_format.commit(table, 1, [a, b])
        assert result.applied
        assert await self.rows(table_format, table) == self.expected(
            (0, range(10)), (3, range(100, 105))
        )

    @pytest.mark.asyncio
    async def test_files_lists_the_committed_files_with_sizes_and_counts(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 1, range(7))
        b = await self.write_file(store, table, 2, range(3))
        await table_format.commit(table, 1, [a, b])
        listed = await table_format.files(table)
        assert sorted((f.path, f.size, f.record_count, f.partition) for f in listed) == sorted(
            (f.path, f.size, f.record_count, f.partition) for f in (a, b)
        )

    @pytest.mark.asyncio
    async def test_retried_commit_with_the_same_sequence_is_a_noop(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(5))
        first = await table_format.commit(table, 1, [a])
        again = await table_format.commit(table, 1, [a])
        assert (first.applied, again.applied) == (True, False)
        assert again.version == first.version
        assert await self.rows(table_format, table) == self.expected((0, range(5)))
        assert [f.path for f in await table_format.files(table)] == [a.path]

    @pytest.mark.asyncio
    async def test_commit_with_a_lower_sequence_is_a_noop(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(5))
        late = await self.write_file(store, table, 0, range(5, 9))
        await table_format.commit(table, 5, [a])
        result = await table_format.commit(table, 3, [late])
        assert not result.applied
        assert await table_format.last_commit(table) == 5
        assert await self.rows(table_format, table) == self.expected((0, range(5)))

    @pytest.mark.asyncio
    async def test_add_and_remove_in_one_commit(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(0, 4))
        b = await self.write_file(store, table, 1, range(0, 4))
        merged = await self.write_file(store, table, 0, range(0, 4))  # a, rewritten by compaction
        await table_format.commit(table, 1, [a, b])
        result = await table_format.commit(table, 2, [merged], [a.path])
        assert result.applied
        assert sorted(f.path for f in await table_format.files(table)) == sorted(
            [b.path, merged.path]
        )
        assert await self.rows(table_format, table) == self.expected((0, range(4)), (1, range(4)))

    @pytest.mark.asyncio
    async def test_remove_only_commit(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        b = await self.write_file(store, table, 0, range(3, 6))
        await table_format.commit(table, 1, [a, b])
        await table_format.commit(table, 2, [], [a.path])
        assert [f.path for f in await table_format.files(table)] == [b.path]
        assert await self.rows(table_format, table) == self.expected((0, range(3, 6)))

    @pytest.mark.asyncio
    async def test_last_commit_is_the_highest_applied_sequence(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        for sequence in (1, 2, 7):  # gaps are allowed: only the order matters
            data = await self.write_file(store, table, 0, [sequence])
            await table_format.commit(table, sequence, [data])
            assert await table_format.last_commit(table) == sequence

    @pytest.mark.asyncio
    async def test_empty_commit_advances_the_sequence(
        self, table_format: TableFormat, table: TableSpec
    ) -> None:
        result = await table_format.commit(table, 4, [])
        assert result.applied
        assert await table_format.last_commit(table) == 4
        assert await table_format.files(table) == []

    @pytest.mark.asyncio
    async def test_adding_a_file_the_table_already_references_fails_and_changes_nothing(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        await table_format.commit(table, 1, [a])
        with pytest.raises(AlreadyExistsError, match=re.escape(a.path)):
            await table_format.commit(table, 2, [a])
        assert await table_format.last_commit(table) == 1
        assert await self.rows(table_format, table) == self.expected((0, range(3)))

    @pytest.mark.asyncio
    async def test_removing_a_file_the_table_does_not_reference_fails_and_changes_nothing(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        b = await self.write_file(store, table, 0, range(3, 5))
        await table_format.commit(table, 1, [a])
        with pytest.raises(NotFoundError, match=re.escape("partition=0/nothing.parquet")):
            await table_format.commit(table, 2, [b], ["partition=0/nothing.parquet"])
        assert await table_format.last_commit(table) == 1
        assert await self.rows(table_format, table) == self.expected((0, range(3)))

    @pytest.mark.asyncio
    async def test_commit_refuses_a_file_whose_row_count_is_not_what_it_says(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        wrong = DataFile(a.path, a.size, a.record_count + 1, a.partition, a.modified_ms)
        with pytest.raises(ValueError, match="rows"):
            await table_format.commit(table, 1, [wrong])
        assert await table_format.last_commit(table) == 0

    @pytest.mark.asyncio
    async def test_commit_refuses_a_non_positive_sequence(
        self, table_format: TableFormat, table: TableSpec
    ) -> None:
        with pytest.raises(ValueError, match="positive"):
            await table_format.commit(table, 0, [])

    @pytest.mark.asyncio
    async def test_commits_are_visible_to_another_instance(
        self,
        table_format: TableFormat,
        store: ObjectStore,
        table: TableSpec,
        tmp_path: Path,
        options: dict[str, Any],
    ) -> None:
        a = await self.write_file(store, table, 2, range(4))
        await table_format.commit(table, 3, [a])
        other = await self.open_table_format(tmp_path, options, store)
        try:
            assert await other.last_commit(table) == 3
            assert [f.path for f in await other.files(table)] == [a.path]
            assert not (await other.commit(table, 3, [a])).applied
        finally:
            await other.close()

    # --- one copy ---------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_data_files_are_never_rewritten_copied_or_deleted(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(6))
        b = await self.write_file(store, table, 1, range(6))
        c = await self.write_file(store, table, 0, range(6, 9))
        written = await self.data_objects(store, table)
        await table_format.commit(table, 1, [a, b])
        await table_format.commit(table, 2, [c], [a.path])  # a is removed from the table…
        await table_format.expire(table, int(time.time() * 1000) + 60_000)
        assert await self.data_objects(store, table) == written  # …but still there, unchanged
        root = layout.table_root(table.identifier)
        listed = {f"{root}/{f.path}" for f in await table_format.files(table)}
        assert listed == {f"{root}/{b.path}", f"{root}/{c.path}"}

    # --- expire -----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_expire_keeps_the_data_readable_and_the_sequence(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        for sequence in range(1, 5):
            data = await self.write_file(store, table, sequence % 2, [sequence])
            await table_format.commit(table, sequence, [data])
        before = await table_format.files(table)
        await table_format.expire(table, int(time.time() * 1000) + 60_000)
        assert await table_format.files(table) == before
        assert await table_format.last_commit(table) == 4
        assert await self.rows(table_format, table) == self.expected((1, [1, 3]), (0, [2, 4]))
        assert not (await table_format.commit(table, 4, [])).applied

    @pytest.mark.asyncio
    async def test_expire_of_a_table_without_history_is_harmless(
        self, table_format: TableFormat, table: TableSpec
    ) -> None:
        await table_format.expire(table, int(time.time() * 1000))
        assert await table_format.files(table) == []

    # --- drop and missing tables ------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_drop_is_idempotent_and_keeps_the_data_files(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        await table_format.commit(table, 1, [a])
        written = await self.data_objects(store, table)
        await table_format.drop(table)
        await table_format.drop(table)
        assert await self.data_objects(store, table) == written
        with pytest.raises(NotFoundError):
            await table_format.last_commit(table)

    @pytest.mark.asyncio
    async def test_a_dropped_table_can_be_created_again_empty(
        self, table_format: TableFormat, store: ObjectStore, table: TableSpec
    ) -> None:
        a = await self.write_file(store, table, 0, range(3))
        await table_format.commit(table, 1, [a])
        await table_format.drop(table)
        await table_format.ensure_table(table)
        assert await table_format.last_commit(table) == 0
        assert await table_format.files(table) == []

    @pytest.mark.asyncio
    async def test_drop_of_a_table_that_never_existed_is_not_an_error(
        self, table_format: TableFormat, spec: TableSpec
    ) -> None:
        await table_format.drop(spec)

    @pytest.mark.asyncio
    async def test_operations_on_a_missing_table_raise_not_found(
        self, table_format: TableFormat, store: ObjectStore, spec: TableSpec
    ) -> None:
        a = await self.write_file(store, spec, 0, range(3))
        with pytest.raises(NotFoundError):
            await table_format.commit(spec, 1, [a])
        with pytest.raises(NotFoundError):
            await table_format.last_commit(spec)
        with pytest.raises(NotFoundError):
            await table_format.files(spec)
