"""The WAL contract suite: the executable form of ``icefloe.ports.wal``.

A backend opts in with a small class in its tests::

    class TestBookKeeperWAL(WALContract):
        backend_name = "bookkeeper"

        def backend_options(self, workdir, unique):
            return {"metadata_service_uri": ZK_URI, "namespace": unique}

        async def open_object_store(self, workdir, unique):
            return None  # not layered on an object store

A WAL layered on an object store gets one from :meth:`WALContract.open_object_store`: by
default a local object store under the test's folder; override it to run the WAL on S3 & co.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_asyncio

from icefloe.errors import NotFoundError
from icefloe.ports.base import Port, PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import MAX_REF_BYTES, WAL, WalObjectInfo
from icefloe.testing.contract import Contract, open_backend

CLOCK_SLACK = 1.0
"""Seconds a backend's clock (or its rounding of times) may differ from this process's."""

UNKNOWN_REF = "no-such-wal-object"


class WALContract(Contract):
    """Generic tests every :class:`WAL` adapter passes; see the module docstring."""

    port_kind: ClassVar[PortKind] = PortKind.WAL

    # --- what an implementer may override ---------------------------------------------------

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore | None:
        """The object store a WAL instance is layered on, or ``None`` for a standalone WAL.

        Args:
            workdir: The test's folder.
            unique: The instance's unique string (a bucket or key prefix for shared servers).
        """
        store = await open_backend(
            PortKind.OBJECT_STORE, "local", workdir, {"root": str(workdir / unique / "objects")}
        )
        assert isinstance(store, ObjectStore)
        return store

    async def open_backend(
        self, workdir: Path, options: dict[str, Any], object_store: ObjectStore | None = None
    ) -> Port:
        """Open the WAL under test, layered on ``object_store`` when given."""
        return await open_backend(
            self.port_kind, self.backend_name, workdir, options, object_store=object_store
        )

    async def open_wal(
        self, workdir: Path, options: dict[str, Any], object_store: ObjectStore | None
    ) -> WAL:
        wal = await self.open_backend(workdir, options, object_store)
        assert isinstance(wal, WAL)
        return wal

    # --- fixtures ---------------------------------------------------------------------------

    @pytest.fixture
    def unique(self) -> str:
        return self.new_unique()

    @pytest.fixture
    def options(self, tmp_path: Path, unique: str) -> dict[str, Any]:
        return self.backend_options(tmp_path, unique)

    @pytest_asyncio.fixture
    async def object_store(self, tmp_path: Path, unique: str) -> AsyncIterator[ObjectStore | None]:
        store = await self.open_object_store(tmp_path, unique)
        try:
            yield store
        finally:
            if store is not None:
                await store.close()

    @pytest_asyncio.fixture
    async def wal(
        self, tmp_path: Path, options: dict[str, Any], object_store: ObjectStore | None
    ) -> AsyncIterator[WAL]:
        wal = await self.open_wal(tmp_path, options, object_store)
        try:
            yield wal
        finally:
            await wal.close()

    # --- append and read --------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_append_returns_a_reference_that_reads_back_the_bytes(self, wal: WAL) -> None:
        ref = await wal.append(b"sealed WAL object")
        assert await wal.read(ref) == b"sealed WAL object"

    @pytest.mark.asyncio
    async def test_reference_is_a_short_str(self, wal: WAL) -> None:
        ref = await wal.append(b"x")
        assert isinstance(ref, str)
        assert 0 < len(ref.encode()) <= MAX_REF_BYTES

    @pytest.mark.asyncio
    async def test_appends_return_distinct_references(self, wal: WAL) -> None:
        refs = [await wal.append(b"same bytes") for _ in range(10)]
        assert len(set(refs)) == len(refs)

    @pytest.mark.asyncio
    async def test_append_accepts_a_memoryview(self, wal: WAL) -> None:
        ref = await wal.append(memoryview(b"xabcx")[1:4])
        assert await wal.read(ref) == b"abc"

    @pytest.mark.asyncio
    async def test_append_of_empty_data_is_rejected(self, wal: WAL) -> None:
        with pytest.raises(ValueError, match="non-empty"):
            await wal.append(b"")
        assert [info async for info in wal.list()] == []

    @pytest.mark.asyncio
    async def test_append_parts_stores_them_one_after_another(self, wal: WAL) -> None:
        # More parts than one vectored write takes (1024 on Linux), as a flush of many
        # batches has; views of a bytearray, as batches are of the request frames.
        frame = bytearray(b"".join(b"%05d" % i for i in range(2000)))
        parts = [memoryview(frame)[i : i + 5] for i in range(0, len(frame), 5)]
        ref = await wal.append_parts([b"head:", *parts, b":tail"])
        assert await wal.read(ref) == b"head:" + bytes(frame) + b":tail"
        assert [info.size async for info in wal.list()] == [len(frame) + 10]

    @pytest.mark.asyncio
    async def test_append_parts_of_no_bytes_is_rejected(self, wal: WAL) -> None:
        nothing: list[list[bytes | memoryview]] = [[], [b"", memoryview(b"")]]
        for parts in nothing:
            with pytest.raises(ValueError, match="non-empty"):
                await wal.append_parts(parts)
        assert [info async for info in wal.list()] == []

    @pytest.mark.asyncio
    async def test_reference_stays_readable_from_a_reopened_wal(
        self, wal: WAL, tmp_path: Path, options: dict[str, Any], object_store: ObjectStore | None
    ) -> None:
        ref = await wal.append(b"durable")
        reopened = await self.open_wal(tmp_path, options, object_store)
        try:
            assert await reopened.read(ref) == b"durable"
        finally:
            await reopened.close()

    @pytest_asyncio.fixture
    async def digits(self, wal: WAL) -> tuple[WAL, str]:
        """The WAL holding one object, ``b"0123456789"``, and its reference."""
        return wal, await wal.append(b"0123456789")

    @pytest.mark.asyncio
    async def test_read_range_from_the_start(self, digits: tuple[WAL, str]) -> None:
        wal, ref = digits
        assert await wal.read(ref, 0, 4) == b"0123"

    @pytest.mark.asyncio
    async def test_read_range_in_the_middle(self, digits: tuple[WAL, str]) -> None:
        wal, ref = digits
        assert await wal.read(ref, 3, 7) == b"3456"

    @pytest.mark.asyncio
    async def test_read_range_end_is_clipped_at_the_size(self, digits: tuple[WAL, str]) -> None:
        wal, ref = digits
        assert await wal.read(ref, 7, 100) == b"789"

    @pytest.mark.asyncio
    async def test_read_range_starting_at_the_size_is_empty(self, digits: tuple[WAL, str]) -> None:
        wal, ref = digits
        assert await wal.read(ref, 10, 20) == b""

    @pytest.mark.asyncio
    async def test_read_with_end_none_reads_to_the_end(self, digits: tuple[WAL, str]) -> None:
        wal, ref = digits
        assert await wal.read(ref, 6) == b"6789"

    @pytest.mark.asyncio
    async def test_read_of_unknown_reference_raises_not_found(self, wal: WAL) -> None:
        with pytest.raises(NotFoundError):
            await wal.read(UNKNOWN_REF)

    # --- delete -----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_delete_makes_the_reference_unreadable(self, wal: WAL) -> None:
        ref = await wal.append(b"released")
        await wal.delete(ref)
        with pytest.raises(NotFoundError):
            await wal.read(ref)

    @pytest.mark.asyncio
    async def test_delete_is_idempotent(self, wal: WAL) -> None:
        ref = await wal.append(b"released")
        await wal.delete(ref)
        await wal.delete(ref)
        await wal.delete(UNKNOWN_REF)
        with pytest.raises(NotFoundError):
            await wal.read(ref)

    @pytest.mark.asyncio
    async def test_delete_keeps_the_other_objects(self, wal: WAL) -> None:
        released = await wal.append(b"released")
        kept = await wal.append(b"kept")
        await wal.delete(released)
        assert await wal.read(kept) == b"kept"
        assert [info.ref async for info in wal.list()] == [kept]

    # --- list -------------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_list_enumerates_every_appended_object_with_its_size(self, wal: WAL) -> None:
        sizes = {await wal.append(b"x" * size): size for size in (1, 10, 100, 1000)}
        assert {info.ref: info.size async for info in wal.list()} == sizes

    @pytest.mark.asyncio
    async def test_list_of_an_empty_wal_is_empty(self, wal: WAL) -> None:
        assert [info async for info in wal.list()] == []

    @pytest.mark.asyncio
    async def test_list_reports_creation_times_between_the_append_and_now(self, wal: WAL) -> None:
        started = time.time()
        for _ in range(3):
            await wal.append(b"timed")
        infos: list[WalObjectInfo] = [info async for info in wal.list()]
        listed = time.time()
        assert len(infos) == 3
        for info in infos:
            assert started - CLOCK_SLACK <= info.created <= listed + CLOCK_SLACK, info

    # --- concurrency ------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_concurrent_appends_are_distinct_and_readable(self, wal: WAL) -> None:
        payloads = [f"object {index}".encode() * (index + 1) for index in range(32)]
        refs = await asyncio.gather(*(wal.append(data) for data in payloads))
        assert len(set(refs)) == len(refs)
        for ref, data in zip(refs, payloads, strict=True):
            assert await wal.read(ref) == data
        assert {info.ref async for info in wal.list()} == set(refs)
