"""A broker's compactor in a process of its own.

The compaction leader's own work (planning, table commits, file statistics, index swaps) is
Python that holds the interpreter lock for milliseconds at a time; inside the broker's process
every client would wait for it. In a process of its own it runs on another core, or, on a
busy machine, at a lower CPU priority (:data:`NICENESS`) than the broker serving clients: it
may use every core the broker could before it was pinned to one.

The broker starts the process, starts it again when it dies (after a back-off) and stops it
when it stops. The process stops by itself once its broker is gone: the pipe between them
closes. Over that pipe the broker also asks for the process's compaction metrics at each
scrape, so that they appear on the broker's ``/metrics`` as they did when compaction ran
inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final

from prometheus_client.metrics_core import Metric

from icefloe import metrics
from icefloe.broker.event_loop import event_loop_factory
from icefloe.broker.long_lived import freeze_long_lived
from icefloe.compaction.service import Compactor, open_when_reachable
from icefloe.config import Config
from icefloe.cpu_affinity import unpinned
from icefloe.ports.object_store import RequestStats
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry

log = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")
NICENESS: Final = 10
"""How much lower than its broker's the compactor's CPU priority is: when both want a core,
the broker's clients come first, and compaction catches up when they pause."""
WATCH_DELAY_S: Final = 0.1
"""How late the compactor may hear of its broker's changes: nothing it does waits on them, and
polling the embedded metadata store for them every 10 ms, while producers write, took about a
tenth of a core."""
RESTART_FIRST_S: Final = 1.0
RESTART_MAX_S: Final = 60.0
"""Back-off before starting a dead compactor's process again; it doubles with each death in a
row."""
STABLE_AFTER_S: Final = 60.0
"""A process up this long has recovered: its next death starts the back-off afresh."""
STOP_TIMEOUT_S: Final = 20.0
"""How long a stopping compactor may take to finish its pass (then it is killed: its run is
finished by the next leader, as after a crash)."""
SCRAPE_TIMEOUT_S: Final = 1.0
"""How long a scrape waits for the compactor's metrics (a process still starting answers
none: the scrape goes on without them)."""


class CompactorProcess:
    """The process a broker's compactor runs in, and the broker's end of the pipe to it."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._process: BaseProcess | None = None
        self._pipe: Connection | None = None
        self._pipe_lock = threading.Lock()
        """Held by a scrape while it waits for an answer, and by whoever replaces the pipe."""
        self._asked = 0

    async def run(self, stopping: asyncio.Event) -> None:
        """Run the compactor's process until ``stopping`` is set, starting it again each time
        it dies; then stop it."""
        delay = RESTART_FIRST_S
        try:
            while True:
                started = time.monotonic()
                try:
                    await self._start()
                except OSError as exc:  # out of processes or memory: try again later
                    log.error("cannot start the compactor's process: %s", exc)
                else:
                    if await _first_set(stopping, self._exited()):
                        return
                    assert self._process is not None
                    if time.monotonic() - started >= STABLE_AFTER_S:
                        delay = RESTART_FIRST_S
                    log.warning(
                        "the compactor's process exited (status %s); starting it again in %.0f s",
                        self._process.exitcode,
                        delay,
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
                if stopping.is_set():
                    return
                metrics.COMPACTOR_RESTARTS.inc()
                delay = min(delay * 2, RESTART_MAX_S)
        finally:
            await self._stop()

    def families(self) -> list[Metric]:
        """The compactor's metrics as its process reports them now; none while it starts, is
        dead, or takes longer than :data:`SCRAPE_TIMEOUT_S` to answer. Called by scrapes, from
        the thread serving them."""
        with self._pipe_lock:
            pipe = self._pipe
            if pipe is None:
                return []
            self._asked += 1
            try:
                pipe.send(self._asked)
                # An answer to an earlier scrape that gave up on it may come first.
                while pipe.poll(SCRAPE_TIMEOUT_S):
                    asked, families = pipe.recv()
                    if asked == self._asked:
                        return list(families)
            except (EOFError, OSError):
                pass  # the process has just died: the broker starts it again
            return []

    async def _start(self) -> None:
        pipe, child_end = _SPAWN.Pipe()
        process = _SPAWN.Process(
            target=run_compactor,
            args=(self._config, child_end),
            name="compactor",
        )
        try:
            await asyncio.to_thread(_start_unpinned, process)
        except BaseException:
            pipe.close()
            raise
        finally:
            child_end.close()  # only the child holds it now: its death shows here as end of file
        await asyncio.to_thread(self._replace, process, pipe)

    async def _exited(self) -> None:
        """Return once the process has exited (it is then reaped)."""
        process = self._process
        assert process is not None
        loop = asyncio.get_running_loop()
        exited: asyncio.Future[None] = loop.create_future()

        def set_exited() -> None:  # the end-of-file stays readable: called until removed
            if not exited.done():
                exited.set_result(None)

        loop.add_reader(process.sentinel, set_exited)
        try:
            await exited
        finally:
            loop.remove_reader(process.sentinel)
        process.join()

    async def _stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.is_alive():
            process.terminate()
            try:
                await asyncio.wait_for(self._exited(), STOP_TIMEOUT_S)
            except TimeoutError:
                log.warning("the compactor did not stop within %.0f s: killed", STOP_TIMEOUT_S)
                process.kill()
                await self._exited()
        # A scrape may hold the pipe meanwhile: wait for it off the event loop.
        await asyncio.to_thread(self._replace, None, None)

    def _replace(self, process: BaseProcess | None, pipe: Connection | None) -> None:
        with self._pipe_lock:
            if self._pipe is not None:
                self._pipe.close()
            if self._process is not None:
                self._process.close()
            self._process, self._pipe = process, pipe


async def _first_set(stopping: asyncio.Event, exited: Coroutine[Any, Any, None]) -> bool:
    """Wait for ``stopping`` or for ``exited``; whether ``stopping`` came."""
    waits = [asyncio.ensure_future(stopping.wait()), asyncio.ensure_future(exited)]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    return stopping.is_set()


# --- the compactor's process ------------------------------------------------------------------


def _start_unpinned(process: BaseProcess) -> None:
    """Start ``process`` on every core the broker had before it was pinned to one, its imports
    included: the calling thread's cores are what it inherits."""
    with unpinned():
        process.start()


def run_compactor(config: Config, pipe: Connection) -> None:
    """Body of the compactor's process: compete for the compaction lease and compact while it
    holds it, until SIGTERM or SIGINT, or until the broker that started it is gone."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s compactor[%(process)d] %(message)s")
    with contextlib.suppress(OSError):  # a priority it may not lower is no reason not to run
        os.nice(NICENESS)
    with asyncio.Runner(loop_factory=event_loop_factory(config.broker.event_loop)) as runner:
        status = runner.run(_compact(config, pipe))
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the loop is gone: a late one just ends it
    sys.exit(status)


class _Reported:
    """What the process reports to its broker at each scrape."""

    def __init__(self) -> None:
        self.storage: StreamStorage | None = None
        self.compactor: Compactor | None = None

    def families(self) -> list[Metric]:
        stats = RequestStats()  # everything this process asks of the object store
        for counted in self._request_stats():
            stats.add(counted.snapshot())
        cpu = metrics.counter(
            "icefloe_compactor_cpu_seconds",
            "CPU time of the broker's compactor process (not of its engine's workers)",
            [],
        )
        cpu.add_metric([], time.process_time())
        return [
            *metrics.COMPACTION.collect(),
            *metrics.object_store_families({"compaction": stats.snapshot()}),
            cpu,
        ]

    def _request_stats(self) -> list[RequestStats]:
        counted = []
        if self.storage is not None:
            counted.append(self.storage.object_store.stats)
        if self.compactor is not None:
            counted.append(self.compactor.engine.stats)
        return counted


async def _compact(config: Config, pipe: Connection) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    reported = _Reported()

    def broker_gone() -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: the process is ending
            loop.call_soon_threadsafe(stop.set)

    threading.Thread(
        target=_answer_scrapes,
        args=(pipe, reported.families, broker_gone),
        name="scrapes",
        daemon=True,
    ).start()
    try:
        storage = await StreamStorage.open(config, watch_delay_s=WATCH_DELAY_S)
    except Exception as exc:  # noqa: BLE001 - one line; the broker starts the process again
        log.error("compaction cannot start: %s", f"{type(exc).__name__}: {exc}".splitlines()[0])
        return 1
    reported.storage = storage
    topics = TopicRegistry(storage, config.table.identifier)
    try:
        await topics.start()
        compactor = await open_when_reachable(config, storage, topics, stop, own_process=True)
        if compactor is None:
            return 0
        reported.compactor = compactor
        freeze_long_lived()  # the table formats' SDKs are imported now
        metrics.COMPACTOR_OPEN.set(1)
        try:
            await compactor.run(stop)
        finally:
            metrics.COMPACTOR_OPEN.set(0)
            await compactor.close()
    finally:
        await topics.close()
        await storage.close()
    return 0


def _answer_scrapes(
    pipe: Connection, families: Callable[[], list[Metric]], broker_gone: Callable[[], None]
) -> None:
    """Answer each scrape the broker asks for until it closes its end of the pipe: then it has
    stopped or died, and this process stops too."""
    while True:
        try:
            asked = pipe.recv()
        except (EOFError, OSError):
            broker_gone()
            return
        try:
            answer = families()
        except Exception:  # a scrape without them beats a dead thread
            log.exception("compaction metrics not reported")
            answer = []
        try:
            pipe.send((asked, answer))
        except OSError:
            broker_gone()
            return
