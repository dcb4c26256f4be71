"""The SparkContext an engine runs on: started on first use, stopped by whoever started it.

PySpark allows one active SparkContext per process. When one is already running (a test
suite's shared context, or an application that embeds Icefloe next to its own Spark jobs), the
engine borrows it and leaves it running on close; otherwise it starts one from its options and
owns it. Everything here blocks: callers run it off the event loop.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Final

from icefloe.cpu_affinity import unpinned
from icefloe.errors import ConfigError, UnavailableError
from icefloe_compaction_spark.options import SparkCompactionOptions

if TYPE_CHECKING:
    from pyspark import SparkContext


DEFAULT_CONF: Final = {"spark.ui.showConsoleProgress": "false"}
"""Spark properties set unless the options set them: a progress bar does not belong in a
broker's log."""


class SparkSessionHolder:
    """Holds one engine's SparkContext; thread-safe."""

    def __init__(self, options: SparkCompactionOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._context: SparkContext | None = None
        self._owned = False

    @property
    def current(self) -> SparkContext | None:
        """The context in use, or ``None`` before the first use and after :meth:`stop`."""
        return self._context

    def context(self) -> SparkContext:
        """The running context, starting or borrowing one on first use.

        Raises:
            ConfigError: Java cannot be found.
            UnavailableError: Spark did not start (e.g. the master cannot be reached).
        """
        with self._lock:
            if self._context is None or _is_stopped(self._context):
                self._context, self._owned = self._start()
            return self._context

    def cancel(self, group: str) -> None:
        """Cancel the running jobs of job group ``group``, if any."""
        context = self._context
        if context is not None and not _is_stopped(context):
            context.cancelJobGroup(group)

    def stop(self) -> None:
        """Stop the context if this holder started it; forget it either way. Idempotent."""
        with self._lock:
            context, owned = self._context, self._owned
            self._context, self._owned = None, False
            if context is not None and owned:
                context.cancelAllJobs()
                context.stop()

    def _start(self) -> tuple[SparkContext, bool]:
        from pyspark import SparkConf, SparkContext

        # SparkContext has no public "is one running?" query; getOrCreate would hide the answer,
        # and the answer decides who stops the context.
        with SparkContext._lock:
            running = SparkContext._active_spark_context
        if running is not None:
            return running, False
        _require_java()
        options = self._options
        conf = (
            SparkConf()
            .setMaster(options.master)
            .setAppName(options.app_name)
            .set("spark.log.level", options.log_level)  # applies from startup, not after it
            .setAll(list({**DEFAULT_CONF, **options.conf}.items()))
        )
        try:
            with unpinned():  # the JVM it starts runs on every core, not the broker's one
                context = SparkContext(conf=conf)
        except Exception as exc:  # PySpark raises several unrelated types here
            raise UnavailableError(
                f"Spark did not start with [compaction.spark] master = {options.master!r}: "
                f"{exc}. Check that the master is reachable and that executors can connect "
                "back to this host (spark.driver.host)"
            ) from exc
        # PySpark takes the workers' interpreter from $PYSPARK_PYTHON (default ``python3`` on
        # PATH), which in local mode may be an interpreter without Icefloe installed.
        python = options.python or (sys.executable if options.is_local else None)
        if python is not None:
            context.pythonExec = python
        return context, True


def _is_stopped(context: SparkContext) -> bool:
    # stop() drops the JVM handle; a stopped context is useless and a new one may be started.
    return context._jsc is None


def _require_java() -> None:
    """Fail with a clear message, not PySpark's "Java gateway process exited"."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        # Spark's launcher uses $JAVA_HOME when it is set, whatever is on PATH.
        if not Path(java_home, "bin", "java").exists():
            raise ConfigError(f"JAVA_HOME={java_home} has no bin/java: fix or unset it")
    elif shutil.which("java") is None:
        raise ConfigError(
            "the spark compaction engine needs Java 17 or later: install a JRE and put `java` "
            "on PATH or set JAVA_HOME"
        )
