"""The in-process compaction engine: tasks run in worker processes on this machine.

Decoding records and encoding Parquet is CPU-bound Python; running it in worker processes keeps
the broker's event loop responsive and uses the machine's other cores.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Self

from pydantic import Field

from icefloe.compaction.task import WorkerResult, run_task_in_worker
from icefloe.cpu_affinity import cores_before_pinning, use_cores
from icefloe.errors import ConfigError
from icefloe.ports.base import BackendOptions, OpenContext
from icefloe.ports.compaction import CompactionEngine, CompactionTask, WrittenFile


class LocalCompactionOptions(BackendOptions):
    workers: int = Field(default=1, ge=1, le=64)
    """Worker processes; tasks beyond this many wait."""
    nice: int = Field(default=10, ge=0, le=19)
    """How much lower the workers' CPU priority is than the broker's (Unix niceness added).
    Compaction can wait; the clients the broker serves on the same cores should not."""


class LocalCompactionEngine(CompactionEngine):
    options_model = LocalCompactionOptions

    def __init__(
        self,
        config: Any,
        workers: int,
        nice: int = 0,
        before_task: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._config = config
        self._before_task = before_task
        # Tasks go to the pool only as workers free up, so that each one passes
        # ``before_task`` just before it starts rather than all of a run's at once.
        self._workers = asyncio.Semaphore(workers)
        self._pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(os.getpid(), nice, cores_before_pinning()),
        )

    @classmethod
    async def open(cls, options: LocalCompactionOptions, context: OpenContext) -> Self:
        if context.config is None:
            raise ConfigError("the local compaction engine needs the configuration to run tasks")
        return cls(context.config, options.workers, options.nice, context.before_local_task)

    def tasks_finished(self) -> int:
        return self._completed

    _completed = 0

    async def _run(self, tasks: list[CompactionTask]) -> list[WrittenFile]:
        results = await asyncio.gather(*(self._run_one(t) for t in tasks))
        for result in results:
            self.stats.add(result.requests)
        return [file for result in results for file in result.files]

    async def _run_one(self, task: CompactionTask) -> WorkerResult:
        async with self._workers:
            if self._before_task is not None:
                await self._before_task()
            loop = asyncio.get_running_loop()
            result = await loop.run_in_executor(self._pool, run_task_in_worker, self._config, task)
        self._completed += 1
        return result

    async def close(self) -> None:
        await asyncio.to_thread(self._pool.shutdown, True, cancel_futures=True)


def _start_worker(parent: int, nice: int, cores: frozenset[int] | None) -> None:
    use_cores(cores)  # not confined to a pinned broker's core
    if nice:
        os.nice(nice)
    _exit_with_parent(parent)


def _exit_with_parent(parent: int) -> None:
    """Make a worker exit when the broker that started it is gone (even after kill -9)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
