"""FileWrites: writes to watched files are heard from the kernel (inotify, on Linux)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from icefloe.embedded import file_writes
from icefloe.embedded.file_writes import FileWrites

HEARD_TIMEOUT_S = 10.0


class Heard:
    def __init__(self) -> None:
        self.count = 0
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()

    async def wait(self) -> None:
        await asyncio.wait_for(self.event.wait(), HEARD_TIMEOUT_S)


def watch(folder: Path, names: list[str], heard: Heard) -> FileWrites:
    writes = FileWrites.watch(folder, names, heard)
    assert writes is not None, "inotify is missing: these tests run on Linux"
    return writes


@pytest.mark.asyncio
async def test_a_write_to_a_watched_file_is_heard(tmp_path: Path) -> None:
    heard = Heard()
    writes = watch(tmp_path, ["db", "db-wal"], heard)
    try:
        await asyncio.sleep(0.1)
        assert writes.quiet_for(0.05)
        (tmp_path / "db-wal").write_bytes(b"page")
        await heard.wait()
        assert not writes.quiet_for(5)
    finally:
        writes.close()
        writes.close()  # idempotent


@pytest.mark.asyncio
async def test_a_file_moved_into_place_is_heard(tmp_path: Path) -> None:
    heard = Heard()
    (tmp_path / "db.new").write_bytes(b"whole file")
    writes = watch(tmp_path, ["db"], heard)
    try:
        os.replace(tmp_path / "db.new", tmp_path / "db")
        await heard.wait()
    finally:
        writes.close()


@pytest.mark.asyncio
async def test_other_files_in_the_folder_are_not_heard(tmp_path: Path) -> None:
    heard, barrier = Heard(), Heard()
    writes = watch(tmp_path, ["db"], heard)
    # A second watch of the other file: the kernel queues a write's events for every watch
    # before the write returns, so once the barrier hears it, so would the first watch.
    barrier_writes = watch(tmp_path, ["other"], barrier)
    try:
        (tmp_path / "other").write_bytes(b"not the database")
        await barrier.wait()
        await asyncio.sleep(0.1)
        assert heard.count == 0
    finally:
        writes.close()
        barrier_writes.close()


@pytest.mark.asyncio
async def test_a_watch_that_cannot_read_its_events_stops_and_counts_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    heard = Heard()
    writes = watch(tmp_path, ["db"], heard)

    def broken_read(timeout: int | None = None) -> list[object]:
        raise OSError(errno.EIO, "input/output error")

    monkeypatch.setattr(writes._notify, "read", broken_read)
    (tmp_path / "db").write_bytes(b"page")
    await heard.wait()
    await asyncio.sleep(0.1)
    assert heard.count == 1, "the unreadable descriptor kept waking the loop"
    assert not writes.quiet_for(3600)  # the caller asks at its own pace from now on
    writes.close()


def test_without_inotify_there_is_no_watch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_writes, "inotify_simple", None)
    assert FileWrites.watch(tmp_path, ["db"]) is None


@pytest.mark.asyncio
async def test_a_folder_that_cannot_be_watched_gives_no_watch(tmp_path: Path) -> None:
    assert FileWrites.watch(tmp_path / "missing", ["db"]) is None
