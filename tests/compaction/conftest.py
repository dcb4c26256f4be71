"""Fixtures of the compaction tests: storage, topics and a compactor on the embedded default
(``parts``), or with both table formats on (``table_parts``); a Spark engine in local mode
shared by a module's tests (``shared_spark``)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from tests.support.spark_engine import shared_spark  # noqa: F401 - a fixture pytest finds here
from tests.support.storage import storage_config


@pytest.fixture
def config(tmp_path: Path, request: pytest.FixtureRequest) -> Config:
    """Storage on the embedded default; a test parametrizes it indirectly with more settings."""
    more = getattr(request, "param", {})
    # A deadline a loaded machine's commits meet; the orphan test waits out the grace period.
    # Reads after a swap take the data files, which these tests are about, not the WAL
    # entries the swap replaced (test_replaced_wal_reads.py).
    settings = {"commit_deadline_s": 2.0, "orphan_grace_s": 2.5, "replaced_wal_reads_s": 0}
    return storage_config(tmp_path, **settings | more)


Parts = tuple[StreamStorage, TopicRegistry, Compactor]


@pytest.fixture
async def parts(config: Config) -> AsyncIterator[Parts]:
    async with opened_parts(config) as opened:
        yield opened


def table_config(data_dir: Path, **sections: dict[str, Any]) -> Config:
    """The embedded default with both table formats on, and more ``sections`` of settings."""
    overrides = {
        "data_dir": str(data_dir),
        "storage": {"flush_interval_ms": 2},
        "table": {"formats": ["iceberg", "delta"]},
    }
    return load_config(env={}, overrides=overrides | sections)


@pytest.fixture
async def table_parts(tmp_path: Path) -> AsyncIterator[Parts]:
    async with opened_parts(table_config(tmp_path)) as opened:
        yield opened


@contextlib.asynccontextmanager
async def opened_parts(config: Config) -> AsyncIterator[Parts]:
    """Storage, topics and a compactor on ``config``, closed on the way out."""
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            yield storage, topics, compactor
        finally:
            await compactor.close()
            await topics.close()
