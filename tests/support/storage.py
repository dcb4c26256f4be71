"""Fixtures for stream storage on the embedded backends, in a temporary data directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
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
    read_from_wal = wal.read

    async def counted(ref: str, start: int = 0, end: int | None = None) -> bytes | memoryview:
        refs.append(ref)
        return await read_from_wal(ref, start, end)

    wal.read = counted  # type: ignore[method-assign]
    return refs
