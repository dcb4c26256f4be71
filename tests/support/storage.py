"""Fixtures for stream storage on the embedded backends, in a temporary data directory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from icefloe.config import Config, load_config
from icefloe.ports.wal import WAL
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record


def storage_config(data_dir: Path, **storage: Any) -> Config:
    settings: dict[str, Any] = {"flush_interval_ms": 2, **storage}
    return load_config(env={}, overrides={"data_dir": str(data_dir), "storage": settings})


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return storage_config(tmp_path)


@pytest.fixture
async def storage(config: Config) -> AsyncIterator[StreamStorage]:
    async with await StreamStorage.open(config) as opened:
        yield opened


@pytest.fixture
async def other_storage(config: Config) -> AsyncIterator[StreamStorage]:
    """A second, independent engine on the same backends (as another process would be)."""
    async with await StreamStorage.open(config) as opened:
        yield opened


async def read_all(storage: StreamStorage, stream: int, max_bytes: int = 64 << 10) -> list[Record]:
    """Every record of ``stream`` up to its log end, a read at a time as a consumer reads: one
    read walks a bounded number of index entries, so a log of many small appends takes several."""
    out: list[Record] = []
    offset, end = 0, await storage.log_end(stream)
    while offset < end:
        batch = await storage.read_records(stream, offset, max_bytes)
        out.extend(batch)
        offset = batch[-1].offset + 1
    return out


def count_wal_reads(wal: WAL) -> list[str]:
    """The references read from ``wal`` from now on, one per read (whichever the backend)."""
    refs: list[str] = []
    _watch_wal_reads(wal, lambda ref, data: refs.append(ref))
    return refs


def wal_read_sizes(wal: WAL) -> list[int]:
    """The bytes each read from ``wal`` returns from now on, one per read."""
    sizes: list[int] = []
    _watch_wal_reads(wal, lambda ref, data: sizes.append(len(data)))
    return sizes


def _watch_wal_reads(wal: WAL, seen: Callable[[str, bytes | memoryview], None]) -> None:
    read_from_wal = wal.read

    async def watched(ref: str, start: int = 0, end: int | None = None) -> bytes | memoryview:
        data = await read_from_wal(ref, start, end)
        seen(ref, data)
        return data

    wal.read = watched  # type: ignore[method-assign]
