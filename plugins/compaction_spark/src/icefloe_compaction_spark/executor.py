"""What runs on a Spark executor: one compaction task, with its error brought home intact.

This module is shipped to executors by value (see ``engine.py``), so executors need Icefloe
and the plugins of the configured WAL and object store, not this plugin.
"""

from __future__ import annotations

from icefloe.compaction.task import run_task_in_worker
from icefloe.config import Config
from icefloe.errors import IcefloeError
from icefloe.ports.compaction import CompactionTask, WrittenFile

Outcome = tuple[list[WrittenFile], dict[str, dict[str, int]], IcefloeError | None]
"""A task's files and the object-store requests it sent, or the error that stopped it."""


def run_task(config: Config, task: CompactionTask) -> Outcome:
    """Run ``task`` on this executor (see :func:`icefloe.compaction.task.run_task_in_worker`).

    A permanent Icefloe error (a gap in the ranges, corrupt WAL bytes, a missing WAL object) is
    returned rather than raised: Spark would retry the task to no avail, and would hand the
    driver only a traceback as text, where the caller needs the typed error. Retriable errors
    and unexpected exceptions are raised, so Spark retries the task (``spark.task.maxFailures``)
    — harmless, since a task writes the same files to the same paths every time.
    """
    try:
        result = run_task_in_worker(config, task)
        return result.files, result.requests, None
    except IcefloeError as exc:
        if exc.retriable:
            raise
        return [], {"requests": {}, "bytes": {}}, exc
