"""Options of ``[compaction] backend = "spark"`` (the ``[compaction.spark]`` table)."""

from __future__ import annotations

from typing import Final, Literal

from pydantic import Field, field_validator

from icefloe.ports.base import BackendOptions

RESERVED_CONF: Final = {
    "spark.master": "master",
    "spark.app.name": "app_name",
    "spark.log.level": "log_level",
    "spark.pyspark.python": "python",
}
"""Spark properties that have an option of their own, and the option to use instead."""


class SparkCompactionOptions(BackendOptions):
    """Where Spark runs and how it is set up.

    The broker process is the Spark driver (client deploy mode): it starts the SparkContext on
    the first compaction and stops it when the engine closes. Executors open the WAL and the
    object store themselves from the Icefloe configuration shipped with each task, so they need
    ``icefloe`` and the plugins of the configured WAL and object store installed (not this
    plugin, and not the broker's files: use a shared object store on a cluster).
    """

    master: str = Field(default="local[*]", min_length=1)
    """Spark master URL: ``local[*]`` (this machine's cores), ``local[N,F]`` (N threads, F
    attempts per task), ``spark://host:7077``, ``k8s://https://host:6443``, ``yarn``."""
    app_name: str = Field(default="icefloe-compaction", min_length=1)
    """Application name shown by the cluster manager and the Spark UI."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Further Spark properties, e.g. ``spark.executor.memory``, ``spark.executor.cores``,
    ``spark.kubernetes.container.image``, ``spark.driver.host``, ``spark.task.maxFailures``.
    Applied when this engine starts the SparkContext."""
    python: str | None = None
    """Python interpreter of the executors' workers (a path valid on the executors). Default:
    this process's interpreter for ``local`` masters, else ``$PYSPARK_PYTHON`` or ``python3``.
    Its ``major.minor`` must match the broker's Python."""
    log_level: Literal["OFF", "FATAL", "ERROR", "WARN", "INFO", "DEBUG", "TRACE", "ALL"] = "WARN"
    """Log level of Spark's JVM (log4j); WARN keeps per-job INFO lines out of the broker's log."""

    @field_validator("conf", mode="before")
    @classmethod
    def _values_as_strings(cls, conf: object) -> object:
        # TOML gives numbers and booleans their own types; Spark properties are strings.
        if isinstance(conf, dict):
            return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in conf.items()}
        return conf

    @field_validator("conf")
    @classmethod
    def _spark_properties_only(cls, conf: dict[str, str]) -> dict[str, str]:
        for key in conf:
            if key in RESERVED_CONF:
                raise ValueError(f"set {key!r} with the option {RESERVED_CONF[key]!r}")
            if not key.startswith("spark."):
                # Spark itself would warn and ignore it: a typo must not pass silently.
                raise ValueError(f"{key!r} is not a Spark property (they start with 'spark.')")
        return conf

    @property
    def is_local(self) -> bool:
        """Whether executors run on this machine (``local``, ``local[N]``, ``local[N,F]``)."""
        return self.master == "local" or self.master.startswith("local[")
