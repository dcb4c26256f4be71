"""The CompactionEngine contract on the Spark engine, in Spark local mode.

Spark starts once for the module (its JVM takes seconds to start); the engine each test opens
borrows that running context and leaves it running when it closes. Without Java or PySpark the
module fails: this run is part of the suite, not optional.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from icefloe_compaction_spark.testing import QUICK_LOCAL_OPTIONS

from icefloe.testing.compaction_contract import CompactionEngineContract
from tests.support.spark_engine import shared_spark  # noqa: F401 - a fixture pytest finds here

# Spark starts once for the module (see above).
pytestmark = pytest.mark.usefixtures("shared_spark")


class TestSparkCompactionEngine(CompactionEngineContract):
    backend_name = "spark"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return QUICK_LOCAL_OPTIONS
