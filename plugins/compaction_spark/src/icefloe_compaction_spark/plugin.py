"""Announces the ``spark`` compaction engine. Imports no PySpark: the adapter is a string."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.COMPACTION,
            "spark",
            "icefloe_compaction_spark.engine:SparkCompactionEngine",
            "Compaction tasks as Spark tasks (PySpark): local[*] or a cluster",
        )
    ]
