"""The CompactionEngine contract on the Spark engine, in Spark local mode.

Spark starts once for the module (its JVM takes seconds to start); the engine each test opens
borrows that running context and leaves it running when it closes. Without Java or PySpark the
module fails: this run is part of the suite, not optional.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from icefloe_compaction_spark.engine import SparkCompactionEngine
from icefloe_compaction_spark.options import SparkCompactionOptions
from icefloe_compaction_spark.testing import QUICK_LOCAL_OPTIONS

from icefloe.config import load_config
from icefloe.ports.base import OpenContext
from icefloe.testing.compaction_contract import CompactionEngineContract


@pytest.fixture(scope="module", autouse=True)
def shared_spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCompactionEngine]:
    """An engine that starts Spark for the whole module, and stops it at the end."""
    data_dir = tmp_path_factory.mktemp("spark")
    context = OpenContext(data_dir=data_dir, config=load_config(env={}))
    options = SparkCompactionOptions.model_validate(QUICK_LOCAL_OPTIONS)
    engine = asyncio.run(SparkCompactionEngine.open(options, context))
    asyncio.run(engine.start())
    try:
        yield engine
    finally:
        asyncio.run(engine.close())


class TestSparkCompactionEngine(CompactionEngineContract):
    backend_name = "spark"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return QUICK_LOCAL_OPTIONS
