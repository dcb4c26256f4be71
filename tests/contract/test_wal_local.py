"""The WAL contract on the local WAL (segment files on this machine's disk), plus its layout,
its segments' lifecycle and what it does with torn or foreign bytes."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from icefloe.config import load_config
from icefloe.embedded import local_wal
from icefloe.embedded.local_wal import HEADER_BYTES, SUFFIX, LocalWAL, LocalWALOptions
from icefloe.errors import ClosedError, NotFoundError, StorageError, UnavailableError
from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.wal import WAL
from icefloe.testing.contract import open_backend
from icefloe.testing.wal_contract import WALContract


class TestLocalWAL(WALContract):
    backend_name = "local"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"path": str(workdir / unique / "wal"), "segment_bytes": 1 << 16}

    async def open_object_store(self, workdir: Path, unique: str) -> ObjectStore | None:
        return None  # files of its own, not objects in a store

    # --- local-WAL-only behaviour -----------------------------------------------------------

    @staticmethod
    def segments(options: dict[str, Any]) -> list[Path]:
        return sorted(Path(options["path"]).glob(f"*{SUFFIX}"))

    @pytest.mark.asyncio
    async def test_the_folder_defaults_to_wal_in_the_data_dir(self, tmp_path: Path) -> None:
        wal = await open_backend(PortKind.WAL, "local", tmp_path, {})
        assert isinstance(wal, LocalWAL)
        try:
            await wal.append(b"x")
            assert len(list((tmp_path / "wal").glob(f"*{SUFFIX}"))) == 1
        finally:
            await wal.close()

    @pytest.mark.asyncio
    async def test_appends_share_a_segment_named_by_its_time(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        before_ms = time.time_ns() // 1_000_000
        refs = [await wal.append(b"payload %d" % i) for i in range(3)]
        [segment] = self.segments(options)
        name = segment.name.removesuffix(SUFFIX)
        assert before_ms <= int(name[:13]) <= time.time_ns() // 1_000_000
        assert all(ref.startswith(name + ":") for ref in refs)
        assert segment.stat().st_size == 3 * (HEADER_BYTES + len(b"payload 0"))

    @pytest.mark.asyncio
    async def test_a_full_segment_is_followed_by_a_new_one(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        payloads = [bytes([i]) * 30_000 for i in range(5)]  # 64 KiB segments: two objects each
        refs = [await wal.append(data) for data in payloads]
        assert len(self.segments(options)) == 3
        for ref, data in zip(refs, payloads, strict=True):
            assert await wal.read(ref) == data
        assert [info.ref async for info in wal.list()] == refs

    @pytest.mark.asyncio
    async def test_an_object_larger_than_a_segment_gets_one_of_its_own(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        small = await wal.append(b"small")
        large = os.urandom(200_000)
        ref = await wal.append(large)
        assert await wal.read(ref) == large
        assert await wal.read(small) == b"small"
        assert len(self.segments(options)) == 2

    @pytest.mark.asyncio
    async def test_a_segment_file_goes_once_its_objects_are_released_and_its_writer_moved_on(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        first = [await wal.append(b"a" * 30_000) for _ in range(2)]
        later = await wal.append(b"b" * 30_000)  # the next segment: the first one is retired
        first_segment, current = self.segments(options)
        for ref in first:
            await wal.delete(ref)
        assert [info.ref async for info in wal.list()] == [later]
        assert self.segments(options) == [current]
        assert not first_segment.exists()
        # The segment still appended to stays while its writer holds it, even once released.
        await wal.delete(later)
        assert [info async for info in wal.list()] == []
        assert self.segments(options) == [current]

    @pytest.mark.asyncio
    async def test_a_segment_whose_writer_closed_goes_once_released(
        self, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        writer = await self.open_wal(tmp_path, options, None)
        ref = await writer.append(b"x")
        await writer.close()
        collector = await self.open_wal(tmp_path, options, None)
        try:
            await collector.delete(ref)
            assert [info async for info in collector.list()] == []
            assert self.segments(options) == []
        finally:
            await collector.close()

    @pytest.mark.asyncio
    async def test_another_process_reads_and_releases_the_objects_but_never_removes_a_held_segment(
        self, wal: WAL, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        ref = await wal.append(b"shared")
        other = await self.open_wal(tmp_path, options, None)
        try:
            assert await other.read(ref) == b"shared"
            await other.delete(ref)
            assert [info async for info in other.list()] == []
            assert len(self.segments(options)) == 1  # the writer still holds it
            with pytest.raises(NotFoundError):
                await wal.read(ref)
            again = await wal.append(b"more")
            assert await other.read(again) == b"more"
        finally:
            await other.close()

    @pytest.mark.asyncio
    async def test_a_torn_end_is_not_listed_and_the_records_before_it_are(
        self, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        writer = await self.open_wal(tmp_path, options, None)
        refs = [await writer.append(b"whole %d" % i) for i in range(2)]
        await writer.close()
        [segment] = self.segments(options)
        with segment.open("ab") as file:  # a crash mid-write: half a header, then noise
            file.write(b"IFWL\x05\x00\x00" + os.urandom(100))
        wal = await self.open_wal(tmp_path, options, None)
        try:
            assert [info.ref async for info in wal.list()] == refs
            for ref in refs:
                await wal.delete(ref)
            assert [info async for info in wal.list()] == []
            assert not segment.exists()
        finally:
            await wal.close()

    @pytest.mark.asyncio
    async def test_an_empty_segment_goes_only_when_stale(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        folder = Path(options["path"])  # made by the WAL's opening
        fresh = folder / f"{time.time_ns() // 1_000_000:013d}-{'a' * 32}{SUFFIX}"
        stale = folder / f"{0:013d}-{'b' * 32}{SUFFIX}"
        for path in (fresh, stale):
            path.touch()
        old = time.time() - local_wal.STALE_EMPTY_SEGMENT_S - 60
        os.utime(stale, (old, old))
        assert [info async for info in wal.list()] == []
        assert fresh.exists()
        assert not stale.exists()

    @pytest.mark.asyncio
    async def test_foreign_files_in_the_folder_are_left_alone(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        folder = Path(options["path"])  # made by the WAL's opening
        (folder / "notes.txt").write_bytes(b"not a segment")
        (folder / f"not-a-name{SUFFIX}").write_bytes(b"IFWL")
        ref = await wal.append(b"x")
        assert [info.ref async for info in wal.list()] == [ref]
        assert (folder / "notes.txt").exists()
        assert (folder / f"not-a-name{SUFFIX}").exists()

    @pytest.mark.asyncio
    async def test_a_reference_that_names_no_live_record_of_that_size_is_not_found(
        self, wal: WAL
    ) -> None:
        ref = await wal.append(b"0123456789")
        name, position, length = ref.split(":")
        for wrong in [
            f"{name}:{int(position) + 1}:{length}",  # inside a record
            f"{name}:{position}:{int(length) - 1}",  # another size
            f"{name}:{position}:{int(length) + 1}",
            f"{name}:99999:{length}",  # past the end of the file
            f"{'0' * 13}-{'0' * 32}:{position}:{length}",  # no such segment
        ]:
            with pytest.raises(NotFoundError):
                await wal.read(wrong)
            await wal.delete(wrong)  # harmless
        assert await wal.read(ref) == b"0123456789"

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        "ref",
        [
            "../escape:0:1",
            "/abs:0:1",
            "x:0:1",
            "bad\x00ref",
            "0:0",
            f"{'0' * 13}-{'0' * 32}:-1:5",
            f"{'0' * 13}-{'0' * 32}:0:1e3",
            f"{'0' * 13}-{'0' * 32}:0:{'9' * 16}",
        ],
    )
    async def test_a_malformed_reference_is_not_found(self, wal: WAL, ref: str) -> None:
        with pytest.raises(NotFoundError):
            await wal.read(ref)
        await wal.delete(ref)  # harmless

    @pytest.mark.asyncio
    async def test_a_read_of_an_uncached_range_goes_through_the_pool(
        self, wal: WAL, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        data = os.urandom(50_000)
        ref = await wal.append(data)
        monkeypatch.setattr(local_wal, "NOWAIT", None)  # as on a system without RWF_NOWAIT
        assert await wal.read(ref, 100, 40_000) == data[100:40_000]
        assert await wal.read(ref) == data

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        ("error", "raised"),
        [(errno.EIO, StorageError), (errno.ENOSPC, UnavailableError)],
        ids=["io-error", "disk-full"],
    )
    async def test_a_failed_sync_fails_the_append_and_the_next_one_starts_a_new_segment(
        self,
        wal: WAL,
        options: dict[str, Any],
        monkeypatch: pytest.MonkeyPatch,
        error: int,
        raised: type[StorageError],
    ) -> None:
        kept = await wal.append(b"before")
        real_sync = os.fdatasync

        def failing_sync(fd: int) -> None:
            monkeypatch.setattr(local_wal.os, "fdatasync", real_sync)
            raise OSError(error, os.strerror(error))

        monkeypatch.setattr(local_wal.os, "fdatasync", failing_sync)
        with pytest.raises(StorageError, match=os.strerror(error)) as failed:
            await wal.append(b"lost")
        assert type(failed.value) is raised  # a full disk is retried; an I/O error is not
        after = await wal.append(b"after")
        assert len(self.segments(options)) == 2
        assert await wal.read(kept) == b"before"
        assert await wal.read(after) == b"after"
        assert after.split(":")[0] != kept.split(":")[0]

    @pytest.mark.asyncio
    async def test_a_cancelled_append_keeps_its_segment_open_until_its_write_ends(
        self, wal: WAL, options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        release = threading.Event()
        syncing = threading.Event()
        real_sync = os.fdatasync

        def slow_sync(fd: int) -> None:
            syncing.set()
            release.wait(10)
            real_sync(fd)

        monkeypatch.setattr(local_wal.os, "fdatasync", slow_sync)
        append = asyncio.create_task(wal.append(b"a" * 40_000))
        await asyncio.to_thread(syncing.wait, 10)
        append.cancel()
        with pytest.raises(asyncio.CancelledError):
            await append
        monkeypatch.setattr(local_wal.os, "fdatasync", real_sync)
        # The next append does not fit: the first segment is retired while its write goes on.
        later = asyncio.create_task(wal.append(b"b" * 40_000))
        await asyncio.sleep(0.05)
        first = self.segments(options)[0]
        assert _held(first)  # still open and locked: the write has not ended
        release.set()
        await later
        await asyncio.sleep(0.05)  # the write's end is handled on the loop
        assert not _held(first)
        assert [info.size async for info in wal.list()] == [40_000, 40_000]

    @pytest.mark.asyncio
    async def test_concurrent_appends_across_a_segment_boundary_are_all_durable(
        self, wal: WAL, options: dict[str, Any]
    ) -> None:
        payloads = [os.urandom(7_000 + i) for i in range(40)]
        refs = await asyncio.gather(*(wal.append(data) for data in payloads))
        assert len(self.segments(options)) >= 4
        for ref, data in zip(refs, payloads, strict=True):
            assert await wal.read(ref) == data

    @pytest.mark.asyncio
    @pytest.mark.parametrize("prefix", [None, "older-wal"])
    async def test_the_object_wals_objects_stay_readable_and_are_collected_through_it(
        self, tmp_path: Path, prefix: str | None
    ) -> None:
        store = await open_backend(PortKind.OBJECT_STORE, "local", tmp_path, {})
        assert isinstance(store, ObjectStore)
        object_options = {} if prefix is None else {"prefix": prefix}
        config = load_config(env={}, overrides={"wal": {"object": object_options}})
        try:
            before = await open_backend(PortKind.WAL, "object", tmp_path, object_options, store)
            assert isinstance(before, WAL)
            older = await before.append(b"written before the switch")
            await before.close()
            wal = await open_backend(PortKind.WAL, "local", tmp_path, {}, store, config=config)
            assert isinstance(wal, WAL)
            try:
                newer = await wal.append(b"written after it")
                assert await wal.read(older, 8, 14) == b"before"
                assert [info.ref async for info in wal.list()] == [older, newer]
                await wal.delete(older)
                assert [info.ref async for info in wal.list()] == [newer]
                assert [info.key async for info in store.list()] == []
                with pytest.raises(NotFoundError):
                    await wal.read(older)
            finally:
                await wal.close()
            await store.put("still/open", b"the store belongs to the caller")
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_calls_after_close_raise_closed(self, wal: WAL) -> None:
        await wal.close()
        with pytest.raises(ClosedError):
            await wal.append(b"x")

    def test_is_not_billed_per_append(self, tmp_path: Path) -> None:
        assert LocalWAL(tmp_path).billed_per_append is False

    @pytest.mark.parametrize("size", [0, 100, 1 << 40])
    def test_a_segment_size_out_of_bounds_is_rejected(self, size: int) -> None:
        with pytest.raises(ValidationError, match="segment_bytes"):
            LocalWALOptions.model_validate({"segment_bytes": size})


def _held(segment: Path) -> bool:
    """Whether some writer holds the segment's lock."""
    fd = os.open(segment, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
