"""The Spark compaction engine: each compaction task is one Spark task.

The same task code as the in-process engine (:mod:`icefloe.compaction.task`) runs on Spark
executors instead of local worker processes. The driver ships the Icefloe configuration with
the tasks; each executor opens the WAL and the object store from it, reads each WAL object of
its task once and writes the Parquet files itself, so no record passes through the driver.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import TYPE_CHECKING, Self

from icefloe.config import Config
from icefloe.errors import ClosedError, ConfigError, StorageError
from icefloe.ports.base import OpenContext
from icefloe.ports.compaction import CompactionEngine, CompactionTask, WrittenFile
from icefloe_compaction_spark import executor
from icefloe_compaction_spark.options import SparkCompactionOptions
from icefloe_compaction_spark.session import SparkSessionHolder

if TYPE_CHECKING:
    from pyspark import SparkContext


class SparkCompactionEngine(CompactionEngine):
    """Runs compaction tasks on Spark; PySpark is imported on first use, not at open."""

    options_model = SparkCompactionOptions

    def __init__(self, config: Config, options: SparkCompactionOptions) -> None:
        self._config = config
        self._local = options.is_local
        self._spark = SparkSessionHolder(options)
        self._closed = False
        self._running: dict[str, int] = {}
        """Job groups of runs under way, with their task counts (for progress reports)."""

    @classmethod
    async def open(cls, options: SparkCompactionOptions, context: OpenContext) -> Self:
        if context.config is None:
            raise ConfigError(
                "the spark compaction engine needs the Icefloe configuration "
                "(OpenContext.config): its executors open the WAL and object store from it"
            )
        return cls(context.config, options)

    def runs_on_this_host(self) -> bool:
        return self._local

    async def start(self) -> None:
        """Start (or borrow) the SparkContext now rather than at the first task.

        A broker may call this at startup to find a wrong master or a missing Java at once.

        Raises:
            ConfigError: Java cannot be found.
            UnavailableError: Spark did not start.
        """
        self._check_open()
        await asyncio.to_thread(self._spark.context)

    async def _run(self, tasks: list[CompactionTask]) -> list[WrittenFile]:
        self._check_open()
        group = f"icefloe-compaction-{uuid.uuid4().hex}"
        self._running[group] = len(tasks)
        try:
            outcomes = await asyncio.to_thread(self._collect, group, tasks)
        except asyncio.CancelledError:
            # The waiting thread cannot be interrupted, but the job can: free the executors.
            # (One local RPC to the driver's JVM; short enough to make on the event loop.)
            self._spark.cancel(group)
            raise
        finally:
            del self._running[group]
        files: list[WrittenFile] = []
        for task_files, requests, error in outcomes:
            self.stats.add(requests)
            if error is not None:
                raise error
            files.extend(task_files)
        return files

    def _collect(self, group: str, tasks: list[CompactionTask]) -> list[executor.Outcome]:
        """Run one Spark job with one partition, and so one Spark task, per compaction task."""
        from py4j.protocol import Py4JError  # type: ignore[import-untyped]

        context = self._spark.context()
        _ship_by_value()
        # Job groups are per thread (PySpark pins Python threads to JVM threads), so this
        # names only the job below, and lets _run cancel it.
        context.setJobGroup(group, f"Icefloe compaction: {len(tasks)} task(s)", True)
        job = functools.partial(executor.run_task, self._config)
        try:
            outcomes: list[executor.Outcome] = (
                context.parallelize(tasks, len(tasks)).map(job).collect()
            )
        except Py4JError as exc:
            raise StorageError(f"the Spark compaction job failed: {_reason(exc)}") from exc
        return outcomes

    def tasks_finished(self) -> int:
        """Tasks of finished runs, and those Spark reports finished in runs under way."""
        context = self._spark.current
        done = super().tasks_finished()
        if context is None:
            return done
        tracker = context.statusTracker()
        for group, count in list(self._running.items()):
            finished = 0
            for job_id in tracker.getJobIdsForGroup(group):
                job = tracker.getJobInfo(job_id)
                for stage_id in job.stageIds if job is not None else ():
                    stage = tracker.getStageInfo(stage_id)
                    finished += stage.numCompletedTasks if stage is not None else 0
            done += min(finished, count)  # a speculative copy may finish too
        return done

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError("the spark compaction engine is closed")

    async def close(self) -> None:
        """Stop the SparkContext if this engine started it (a borrowed one keeps running)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._spark.stop)

    @property
    def spark_context(self) -> SparkContext | None:
        """The context in use, or ``None`` before the first task and after close."""
        return self._spark.current


@functools.cache
def _ship_by_value() -> None:
    """Pickle :mod:`executor`'s functions by value, so executors need only Icefloe installed.

    By default cloudpickle pickles a module-level function by reference, which an executor
    without this plugin could not import.
    """
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(executor)  # type: ignore[no-untyped-call]


def _reason(exc: Exception) -> str:
    """The Python exception line of a failed job, else the first line of the Java error."""
    text = str(exc)
    python_errors = [
        line.strip()
        for line in text.splitlines()
        if line and not line[0].isspace() and ("Error" in line or "Exception" in line)
    ]
    lines = [line for line in text.splitlines() if line.strip()]
    return python_errors[-1] if python_errors else (lines[0] if lines else type(exc).__name__)
