"""The ObjectStore contract on the local filesystem store, plus what only a filesystem has.

The contract's cross-process tests (a create-if-absent race between processes, a writer
killed mid-upload) run here too, through the inherited suite.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from icefloe.embedded import local_object_store
from icefloe.embedded.local_object_store import STALE_TEMP_SECONDS, LocalObjectStore
from icefloe.errors import (
    AlreadyExistsError,
    ClosedError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.testing.contract import open_backend
from icefloe.testing.object_store_contract import ObjectStoreContract, chunks_of, keys_of


class TestLocalObjectStore(ObjectStoreContract):
    backend_name = "local"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"root": str(workdir / unique / "objects")}

    async def backdoor_read(self, store: ObjectStore, key: str) -> bytes | None:
        assert isinstance(store, LocalObjectStore)
        path = store.root / key
        return path.read_bytes() if path.is_file() else None

    # --- local-only behaviour -----------------------------------------------------------

    @pytest.mark.asyncio
    async def test_default_root_is_objects_in_the_data_dir(self, tmp_path: Path) -> None:
        store = await open_backend(PortKind.OBJECT_STORE, "local", tmp_path, {})
        assert isinstance(store, LocalObjectStore)
        try:
            await store.put("a/b", b"x")
        finally:
            await store.close()
        assert (tmp_path / "objects" / "a" / "b").read_bytes() == b"x"

    @pytest.mark.asyncio
    async def test_temporary_files_live_outside_the_root(self, store: ObjectStore) -> None:
        assert isinstance(store, LocalObjectStore)
        assert store.temp_dir.parent == store.root.parent
        assert store.temp_dir.name.startswith(".")

    @pytest.mark.asyncio
    async def test_only_the_empty_spare_remains_after_writes_and_nothing_after_close(
        self, store: ObjectStore
    ) -> None:
        assert isinstance(store, LocalObjectStore)
        await store.put("a", b"1")
        await store.put("a", b"2")
        with pytest.raises(AlreadyExistsError):
            await store.put("a", b"3", if_absent=True)
        await store.put_stream("b", chunks_of([b"4", b"5"]), if_absent=True)
        assert (await _the_spare(store)).stat().st_size == 0  # the only temporary file
        await store.close()
        assert list(store.temp_dir.iterdir()) == []

    @pytest.mark.asyncio
    async def test_a_put_writes_into_the_spare_made_after_the_put_before(
        self, store: ObjectStore
    ) -> None:
        assert isinstance(store, LocalObjectStore)
        await store.put("first", b"1")
        spare = await _the_spare(store)
        inode = spare.stat().st_ino

        await store.put("second", b"2")

        assert (store.root / "second").stat().st_ino == inode  # the spare became the object
        assert not spare.exists()
        assert (store.root / "second").read_bytes() == b"2"
        assert await _the_spare(store) != spare

    @pytest.mark.asyncio
    async def test_a_spare_left_unused_too_long_is_replaced(
        self, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        assert isinstance(store, LocalObjectStore)
        await store.put("first", b"1")
        spare = await _the_spare(store)
        spare.write_bytes(b"not the put's bytes")  # as if the file had been reused
        monkeypatch.setattr(local_object_store, "SPARE_MAX_AGE_S", 0.0)

        await store.put("second", b"2")

        assert (store.root / "second").read_bytes() == b"2"  # a fresh file, not the spare
        assert not spare.exists()  # removed, not left behind
        assert await store.get("first") == b"1"

    @pytest.mark.asyncio
    async def test_delete_prunes_empty_folders_but_keeps_the_root(self, store: ObjectStore) -> None:
        assert isinstance(store, LocalObjectStore)
        await store.put("x/y/z/object", b"1")
        await store.put("x/other", b"2")
        await store.delete("x/y/z/object")
        assert sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*")) == [
            "x",
            "x/other",
        ]
        await store.delete("x/other")
        assert store.root.is_dir()
        assert list(store.root.iterdir()) == []

    @pytest.mark.asyncio
    async def test_get_view_reads_from_disk_what_the_page_cache_does_not_hold(
        self, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # The event loop copies only what the page cache holds; the rest is read by the pool.
        # What the kernel caches shifts with its read-ahead, so the cache here is simulated:
        # the loop's non-blocking read stops short where the cached part ends, as the kernel's.
        assert isinstance(store, LocalObjectStore)
        cached = 1 << 20
        data = os.urandom(3 << 20)
        await store.put("wal/object", data)
        monkeypatch.setattr(os, "preadv", _short_when_nowait(os.preadv, cached))
        pool_reads: list[int] = []
        read_into = store._read_into

        def spied_read_into(*args: Any) -> tuple[memoryview, int]:
            pool_reads.append(args[-1])  # how much the loop had filled
            return read_into(*args)

        monkeypatch.setattr(store, "_read_into", spied_read_into)

        view = await store.get_view("wal/object", 100, 3_000_000)

        assert view.tobytes() == data[100:3_000_000]
        assert pool_reads == [cached - 100]  # the loop copied the cached part, the pool the rest

    @pytest.mark.asyncio
    async def test_get_view_of_a_file_partly_dropped_from_the_page_cache_is_whole(
        self, store: ObjectStore
    ) -> None:
        # The same on the real page cache, wherever the filesystem lets pages go.
        assert isinstance(store, LocalObjectStore)
        data = os.urandom(3 << 20)
        await store.put("wal/object", data)
        fd = os.open(store.root / "wal" / "object", os.O_RDONLY)
        try:
            # The put fsync-ed, so the pages are clean and the kernel drops them if it can.
            os.posix_fadvise(fd, 1 << 20, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

        view = await store.get_view("wal/object", 100, 3_000_000)

        assert view.tobytes() == data[100:3_000_000]
        assert await store.get("wal/object") == data

    @pytest.mark.asyncio
    async def test_get_view_of_a_folder_of_other_keys_is_not_found(
        self, store: ObjectStore
    ) -> None:
        await store.put("a/b", b"x")
        with pytest.raises(NotFoundError):
            await store.get_view("a", 0, 1)

    @pytest.mark.asyncio
    async def test_concurrent_puts_and_deletes_in_one_folder_lose_no_object(
        self, store: ObjectStore
    ) -> None:
        # Deletes prune folders that concurrent puts are about to write into.
        async def churn(index: int) -> None:
            for round_ in range(10):
                await store.put(f"deep/folder/{index}-{round_}", b"x")
                await store.delete(f"deep/folder/{index}-{round_}")
            await store.put(f"deep/folder/{index}", b"kept")

        await asyncio.gather(*(churn(index) for index in range(8)))
        assert await keys_of(store, "deep/") == [f"deep/folder/{index}" for index in range(8)]

    @pytest.mark.asyncio
    async def test_a_key_that_is_a_folder_of_other_keys_cannot_be_written(
        self, store: ObjectStore
    ) -> None:
        await store.put("a/b", b"x")
        with pytest.raises(StorageError, match="folder"):
            await store.put("a", b"y")
        with pytest.raises(StorageError, match="folder"):
            await store.put("a/b/c", b"y")
        with pytest.raises(NotFoundError):
            await store.get("a")
        assert await store.head("a") is None
        await store.delete("a")
        assert await keys_of(store) == ["a/b"]

    @pytest.mark.asyncio
    async def test_a_streamed_put_counts_as_one_put(self, store: ObjectStore) -> None:
        before = store.stats.snapshot()
        await store.put_stream("streamed", chunks_of([b"a" * 10] * 5))
        after = store.stats.snapshot()
        assert after["requests"]["PUT"] - before["requests"]["PUT"] == 1
        assert after["bytes"]["PUT"] - before["bytes"]["PUT"] == 50

    @pytest.mark.asyncio
    async def test_a_large_object_is_made_durable_a_few_megabytes_at_a_time(
        self, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # Counted, not replaced: the data still goes to the disk.
        synced: list[int] = []
        fdatasync = os.fdatasync
        monkeypatch.setattr(
            local_object_store.os, "fdatasync", lambda fd: (synced.append(fd), fdatasync(fd))
        )
        step = local_object_store.WRITE_BACK_BYTES
        large = os.urandom(2 * step + 1)
        await store.put("large", large)
        assert len(synced) == 2  # the last byte is made durable with the commit's fsync
        half = step // 2
        parts = [large[at : at + half] for at in range(0, len(large), half)]
        await store.put_stream("streamed", chunks_of(parts))
        assert len(synced) == 4
        await store.put("small", b"x" * (step - 1))
        assert len(synced) == 4
        assert await store.get("large") == large
        assert await store.get("streamed") == large

    @pytest.mark.asyncio
    async def test_a_full_disk_is_unavailable_until_space_is_freed(
        self, store: ObjectStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # fsync is where a full disk shows on filesystems that allocate late (ext4, XFS, NFS).
        def full(fd: int) -> None:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        assert isinstance(store, LocalObjectStore)
        monkeypatch.setattr(local_object_store.os, "fsync", full)
        with pytest.raises(UnavailableError, match="the disk is full"):
            await store.put("kept-out", b"x" * 100)
        assert await keys_of(store, "") == []
        assert [p.name for p in store.temp_dir.iterdir() if p.stat().st_size] == []
        monkeypatch.undo()
        await store.put("kept-out", b"x" * 100)
        assert await store.get("kept-out") == b"x" * 100

    @pytest.mark.asyncio
    async def test_primitives_refuse_keys_outside_the_root(self, store: ObjectStore) -> None:
        assert isinstance(store, LocalObjectStore)
        # The port validates keys first; the adapter guards its paths anyway.
        with pytest.raises(ValueError, match="outside"):
            await store._get("../escape", 0, None)
        with pytest.raises(ValueError, match="outside"):
            await store._put("../escape", b"x", False)
        assert not (store.root.parent / "escape").exists()

    @pytest.mark.asyncio
    async def test_calls_after_close_raise_closed(self, tmp_path: Path) -> None:
        store = await self.open_store(tmp_path, self.backend_options(tmp_path, "closed"))
        await store.close()
        with pytest.raises(ClosedError):
            await store.put("a", b"x")
        with pytest.raises(ClosedError):
            await keys_of(store)

    @pytest.mark.asyncio
    async def test_open_removes_stale_temporary_files_only(
        self, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        store = await self.open_store(tmp_path, options)
        assert isinstance(store, LocalObjectStore)
        await store.close()
        stale, fresh = store.temp_dir / "stale.part", store.temp_dir / "fresh.part"
        stale.write_bytes(b"left by a dead writer")
        fresh.write_bytes(b"being written")
        old = time.time() - STALE_TEMP_SECONDS - 60
        os.utime(stale, (old, old))
        await (await self.open_store(tmp_path, options)).close()
        assert (stale.exists(), fresh.exists()) == (False, True)


async def _the_spare(store: LocalObjectStore) -> Path:
    """The temporary file made for the next put, once it is there."""
    deadline = time.monotonic() + 10
    while not (files := list(store.temp_dir.iterdir())):
        assert time.monotonic() < deadline, "no spare temporary file made"
        await asyncio.sleep(0.01)
    [spare] = files
    return spare


def _short_when_nowait(
    preadv: Callable[..., int], cached: int
) -> Callable[[int, list[Any], int, int], int]:
    """``os.preadv`` for a file of which only the first ``cached`` bytes are in the page cache."""

    def short_preadv(fd: int, buffers: list[Any], offset: int, flags: int = 0) -> int:
        if not flags & os.RWF_NOWAIT:
            return preadv(fd, buffers, offset, flags)
        if offset >= cached:
            raise BlockingIOError(errno.EAGAIN, "not in the page cache")
        # The cached part is read without the flag: some filesystems (tmpfs) refuse it.
        return preadv(fd, [memoryview(buffers[0])[: cached - offset]], offset)

    return short_preadv
