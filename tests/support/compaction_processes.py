"""A compactor that kills itself (SIGKILL) at a chosen step of the saga, for crash tests."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from icefloe.compaction.committer import TaskRecord
from icefloe.compaction.local_engine import LocalCompactionEngine
from icefloe.compaction.service import Compactor
from icefloe.config import Config
from icefloe.ports.metadata import Delete
from icefloe.storage.engine import StreamStorage
from icefloe.storage.keys import is_index_key
from icefloe.topics.registry import TopicRegistry

PRELOADED_MODULES = (
    __name__,
    "icefloe_table_iceberg.table_format",
    "icefloe_table_delta.table_format",
    "icefloe_store_s3.store",
    "pyiceberg.catalog.sql",
)
"""What every crash test's compactor imports: the fork server imports it once."""


def preloaded_processes() -> multiprocessing.context.ForkServerContext:
    """Processes forked from a server that has imported the compactor and the table formats.

    A spawned process imports them afresh, about 2 s of CPU for each crash test; the fork
    server is a single-threaded process started for this purpose, so forking it is safe."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOADED_MODULES))
    return context


CRASH_POINTS = ("files-written", "written", "committed", "first-table", "mid-swap")
"""files-written: the Parquet files exist, the task still says 'planned';
written / committed: right after the task record reached that state;
first-table: after the first table format committed, before the others;
mid-swap: after the Parquet entry replaced the last WAL entry, before the others are deleted."""


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def compact_and_crash(config: Config, crash_at: str, work: str = "compact") -> None:
    """Run ``work`` (``compact``: compaction until idle; ``rewrite``: table maintenance's
    rewrites until none is due) and SIGKILL this process at ``crash_at``."""

    async def main() -> None:
        storage = await StreamStorage.open(config)
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        committer = compactor.committer
        save = committer._save

        async def save_then_maybe_die(record: TaskRecord) -> None:
            if crash_at == "files-written" and record.state == "written":
                _die()
            await save(record)
            if record.state == crash_at:
                _die()

        committer._save = save_then_maybe_die  # type: ignore[method-assign]
        if crash_at == "first-table" and compactor.table_formats:
            first = next(iter(compactor.table_formats.values()))
            commit = first.commit

            async def commit_then_die(*args: Any, **kwargs: Any) -> Any:
                await commit(*args, **kwargs)
                _die()

            first.commit = commit_then_die  # type: ignore[method-assign]
        if crash_at == "mid-swap":
            delete = storage.metadata.delete

            async def delete_or_die(key: str, **kwargs: Any) -> bool:
                if is_index_key(key):
                    _die()
                return await delete(key, **kwargs)

            storage.metadata.delete = delete_or_die  # type: ignore[method-assign]
            transact = storage.metadata.transact

            async def transact_or_die(checks: Any, writes: Sequence[Any]) -> None:
                if any(isinstance(w, Delete) and is_index_key(w.key) for w in writes):
                    _die()  # a swap's deletes go a chunk per transaction where the store can
                await transact(checks, writes)

            storage.metadata.transact = transact_or_die  # type: ignore[method-assign]
        if work == "rewrite":
            while await compactor.rewrite_once() is not None:
                pass
        else:
            await compactor.until_idle()
        raise SystemExit(f"the compactor did not reach {crash_at!r}")

    asyncio.run(main())


def start_engine_worker_then_wait(report: Any) -> None:
    """Start the local engine's worker process, report its pid, then wait to be killed."""
    engine = LocalCompactionEngine(config=None, workers=1)
    report.put(engine._pool.submit(os.getpid).result(60))
    time.sleep(600)


__all__ = [
    "CRASH_POINTS",
    "Path",
    "compact_and_crash",
    "preloaded_processes",
    "start_engine_worker_then_wait",
]
