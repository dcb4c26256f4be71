"""Fixtures of the compaction tests: storage, topics and a compactor on the embedded default
(``parts``), or with both table formats on (``table_parts``); a Spark engine in local mode
shared by a module's tests (``shared_spark``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.ports.base import OpenContext
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from tests.support.storage import storage_config

if TYPE_CHECKING:
    from icefloe_compaction_spark.engine import SparkCompactionEngine


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return storage_config(tmp_path, commit_deadline_s=0.2, orphan_grace_s=0.5)


Parts = tuple[StreamStorage, TopicRegistry, Compactor]


@pytest.fixture
async def parts(config: Config) -> AsyncIterator[Parts]:
    async with _parts(config) as opened:
        yield opened


@pytest.fixture
async def table_parts(tmp_path: Path) -> AsyncIterator[Parts]:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"]},
        },
    )
    async with _parts(config) as opened:
        yield opened


@contextlib.asynccontextmanager
async def _parts(config: Config) -> AsyncIterator[Parts]:
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            yield storage, topics, compactor
        finally:
            await compactor.close()
            await topics.close()


@pytest.fixture(scope="module")
def shared_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCompactionEngine]:
    """An engine that starts Spark (local mode) for the whole module and stops it at the end;
    engines the tests open borrow its context (a JVM takes seconds to start)."""
    # Imported here: only the Spark tests pay for the plugin's imports.
    from icefloe_compaction_spark.engine import SparkCompactionEngine
    from icefloe_compaction_spark.options import SparkCompactionOptions
    from icefloe_compaction_spark.testing import QUICK_LOCAL_OPTIONS

    context = OpenContext(data_dir=tmp_path_factory.mktemp("spark"), config=load_config(env={}))
    options = SparkCompactionOptions.model_validate(QUICK_LOCAL_OPTIONS)
    engine = asyncio.run(SparkCompactionEngine.open(options, context))
    asyncio.run(engine.start())
    try:
        yield engine
    finally:
        asyncio.run(engine.close())
