"""A Spark compaction engine in local mode, started once for a test module."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from icefloe.config import load_config
from icefloe.ports.base import OpenContext

if TYPE_CHECKING:
    from icefloe_compaction_spark.engine import SparkCompactionEngine


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
