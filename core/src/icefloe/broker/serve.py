"""``icefloe serve``: N broker processes on one machine, supervised by this one.

Each broker is a separate process (Python runs one core per process) listening on its own port,
``port``, ``port + 1``, …; clients bootstrap from the first. SIGTERM or Ctrl-C stops them all
cleanly: each stops accepting, commits what it buffered and deregisters.

Starting fails fast: a broker that cannot start (port taken, data folder not writable, metadata
store unreachable) reports why, and ``serve`` stops the others and exits non-zero with one line
naming the cause and the fix, so that a supervisor (systemd, Kubernetes) sees the failure.

Once running, one broker's trouble stays its own: a broker that dies is started again while the
others serve on. One killed from outside (SIGKILL: an operator, a chaos test) is started again
after :data:`FIRST_RESTART_DELAY_S`, as often as it happens; one that crashed by itself after a
back-off that doubles with each crash in a row. Only when every broker has crashed
:data:`MAX_CRASHES_IN_A_ROW` times in a row, so that nothing serves, does ``serve`` give up and
exit non-zero: a fault that survives that many restarts everywhere is not one a restart mends.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import multiprocessing
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Final

from icefloe.broker.event_loop import event_loop_factory
from icefloe.broker.heap import arrow_from_jemalloc, reuse_large_blocks
from icefloe.broker.long_lived import freeze_long_lived, freeze_new_imports
from icefloe.broker.port_plan import port_clash
from icefloe.config import Config
from icefloe.cpu_affinity import pin_to_one_core
from icefloe.errors import ConfigError, PluginError, UnavailableError

log = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")
READY_TIMEOUT_S: Final = 60.0
"""How long a broker may take to start before ``serve`` gives up on it."""
STOP_TIMEOUT_S: Final = 30.0
FIRST_RESTART_DELAY_S: Final = 1.0
MAX_RESTART_DELAY_S: Final = 30.0
STABLE_AFTER_S: Final = 60.0
"""A broker up this long has recovered: its next crash starts the back-off afresh."""
MAX_CRASHES_IN_A_ROW: Final = 5
_KILLED: Final = -signal.SIGKILL
"""The exit status of a process SIGKILLed: not a crash of its own."""
_POLL_S: Final = 0.2


@dataclass
class _Child:
    index: int
    port: int
    process: BaseProcess
    started: float
    reports: Connection
    """Where the broker reports ``("ready", address)`` or ``("failed", line)``, once."""
    crashes: int = 0
    """Crashes in a row (reset once the broker has stayed up ``STABLE_AFTER_S``)."""
    restart_at: float | None = None


class StartFailed(Exception):
    """A broker could not start; the message is the one line ``serve`` prints."""


def run_broker(
    config: Config,
    index: int,
    port: int,
    metrics_port: int | None,
    report: Connection,
    registry_port: int | None = None,
) -> None:
    """Body of a broker process: start, report, serve until SIGTERM/SIGINT, stop cleanly."""
    # Imported here, in the broker's process: the supervising one never needs the broker.
    from icefloe.broker.broker import Broker

    logging.basicConfig(level=logging.INFO, format="%(asctime)s broker[%(process)d] %(message)s")
    if config.broker.pin_to_core:  # before any thread starts: they inherit the core
        core = pin_to_one_core(index)
        if core is not None:
            log.info("broker %d runs on core %d", index, core)
    heap_trimmer = reuse_large_blocks()
    allocator = arrow_from_jemalloc()
    log.debug("broker %d: Arrow allocates from %s", index, allocator)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        broker: Broker | None = None
        try:
            broker = await Broker.open(config)
            info = await broker.start(port, metrics_port, index, registry_port)
        except Exception as exc:  # noqa: BLE001 - every cause becomes one line for the parent
            report.send(("failed", startup_failure(exc, config, port)))
            if broker is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(broker.stop(), STOP_TIMEOUT_S)
            return 1
        # What exists now (modules, schemas, plugins) lives as long as the process: keep it out
        # of the collector's full passes, which otherwise stall the loop for 100-200 ms each.
        freeze_long_lived()
        freezer = asyncio.create_task(freeze_new_imports(), name="freeze-new-imports")
        trimming = None
        if heap_trimmer is not None:
            trimming = asyncio.create_task(heap_trimmer.run(), name="heap-trimmer")
        registry = broker.schema_registry_port
        report.send(
            (
                "ready",
                (info.node_id, info.host, info.port, info.metrics_port, info.listeners, registry),
            )
        )
        try:
            await stop.wait()
        finally:
            freezer.cancel()
            if trimming is not None:
                trimming.cancel()
            await broker.stop()
        return 0

    with asyncio.Runner(loop_factory=event_loop_factory(config.broker.event_loop)) as runner:
        status = runner.run(main())
    # The loop and its signal handlers are gone: a late SIGTERM just ends the process.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(status)


def startup_failure(exc: BaseException, config: Config, port: int) -> str:
    """One line naming why a broker could not start and how to fix it."""
    host = config.broker.host
    cause = _root_os_error(exc)
    if cause is not None and cause.filename is not None:
        return (
            f"cannot use {cause.filename}: {cause.strerror}; make the data folder writable, "
            f"or choose another with --data-dir (now {config.data_dir})"
        )
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is already in use: stop what is listening there, or "
            "choose another port with --port (or [broker] port)"
        )
    if isinstance(exc, OSError) and exc.errno == errno.EADDRNOTAVAIL:
        return f"cannot listen on {host}: not an address of this machine; set [broker] host"
    if isinstance(exc, ConfigError | PluginError):
        return str(exc)
    if isinstance(exc, UnavailableError):
        return (
            f"a backend is unreachable: {exc}; check that the servers named in [metadata] "
            f"({config.metadata.backend}) and [object_store] ({config.object_store.backend}) "
            "are running and reachable"
        )
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _root_os_error(exc: BaseException) -> OSError | None:
    """The OSError at the root of an exception chain (adapters raise ``from`` it), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def serve(config: Config, brokers: int) -> int:
    """Run ``brokers`` broker processes until a signal; returns the exit status."""
    # Its lines (a broker killed, restarted) are dated like the brokers' own.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s serve[%(process)d] %(message)s")
    clash = port_clash(config, brokers)
    if clash is not None:
        print(f"icefloe: {clash}", file=sys.stderr, flush=True)
        return 1
    base = config.broker.port
    children = [_start(config, i, base + i if base else 0) for i in range(brokers)]
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.set())
    try:
        started = _await_start(children, stopping.is_set)
    except StartFailed as failure:
        print(f"icefloe: {failure}", file=sys.stderr, flush=True)
        _stop_all(children)
        return 1
    if stopping.is_set():
        _stop_all(children)
        return 0
    host = started[0][1]
    ports = [p for _, _, p, *_ in started]
    # With --port 0 each broker takes any free port: name them, not a range.
    on = f"{ports[0]}-{ports[-1]}" if base else ", ".join(map(str, ports))
    print(
        f"Icefloe is serving Kafka at {host}:{ports[0]} "
        f"({brokers} broker{'s' if brokers > 1 else ''} on ports {on}; "
        f"data in {config.data_dir})",
        flush=True,
    )
    metrics_ports = [m for _, _, _, m, *_ in started if m is not None]
    if metrics_ports:
        metrics_host = config.metrics.host or host
        print(
            "Metrics and health: "
            + ", ".join(
                f"{config.metrics.scheme}://{metrics_host}:{m}/metrics" for m in metrics_ports
            ),
            flush=True,
        )
    registry_ports = [r for *_, r in started if r is not None]
    if registry_ports:
        registry_host = config.schema_registry.host or host
        print(
            "Schema registry: "
            + ", ".join(
                f"{config.schema_registry.scheme}://{registry_host}:{r}" for r in registry_ports
            ),
            flush=True,
        )
    further = [f"{n}://{h}:{p}" for *_, listeners, _ in started for n, h, p in listeners[1:]]
    if further:
        print(f"Further listeners: {', '.join(further)}", flush=True)
    while not stopping.wait(_POLL_S):
        for i, child in enumerate(children):
            children[i] = _supervise(config, child)
        if all(c.crashes >= MAX_CRASHES_IN_A_ROW for c in children):
            print(
                f"icefloe: every broker crashed {MAX_CRASHES_IN_A_ROW} times in a row; "
                "giving up, see the log above",
                file=sys.stderr,
                flush=True,
            )
            _stop_all(children)
            return 1
    _stop_all(children)
    return 0


def _await_start(children: list[_Child], stopping: Callable[[], bool]) -> list[Any]:
    """Wait until every broker reports ready; the first failure or death ends the wait.

    Raises:
        StartFailed: with the line to print.
    """
    deadline = time.monotonic() + READY_TIMEOUT_S
    started: dict[int, Any] = {}
    while len(started) < len(children) and not stopping():
        waiting = {c.reports: c for c in children if c.index not in started}
        for reports in wait(list(waiting), timeout=_POLL_S):
            child = waiting[reports]  # type: ignore[index]
            try:
                kind, detail = child.reports.recv()
            except EOFError:
                child.process.join()
                raise StartFailed(
                    f"the broker for port {child.port} exited "
                    f"(status {child.process.exitcode}) before it started; see the log above"
                ) from None
            if kind == "failed":
                child.process.join(STOP_TIMEOUT_S)  # it exits by itself once it has reported
                raise StartFailed(f"the broker for port {child.port} cannot start: {detail}")
            started[child.index] = detail
            child.port = detail[2]  # a broker given port 0 restarts on the port it took
        if time.monotonic() > deadline:
            late = [c.port for c in children if c.index not in started]
            raise StartFailed(
                f"the brokers for ports {late} did not start within {READY_TIMEOUT_S:.0f} s; "
                "see the log above"
            )
    return [started[i] for i in sorted(started)]


def _take_report(child: _Child) -> None:
    """Log what a restarted broker reported (a restart that fails to start is a crash)."""
    with contextlib.suppress(EOFError, OSError):
        if child.reports.poll():
            kind, detail = child.reports.recv()
            if kind == "ready":
                log.warning("broker on port %d is serving again", child.port)
            else:
                log.warning("broker on port %d could not start again: %s", child.port, detail)


def _supervise(config: Config, child: _Child) -> _Child:
    """Restart a dead broker after its back-off (see the module docstring)."""
    now = time.monotonic()
    if child.restart_at is not None:
        if now < child.restart_at:
            return child
        restarted = _start(config, child.index, child.port)
        restarted.crashes = child.crashes
        return restarted
    _take_report(child)
    if child.process.is_alive():
        if child.crashes and now - child.started >= STABLE_AFTER_S:
            child.crashes = 0
        return child
    child.process.join()
    child.reports.close()
    status = child.process.exitcode
    if status == _KILLED:
        delay = FIRST_RESTART_DELAY_S
        log.warning("broker on port %d was killed; restarting in %.0f s", child.port, delay)
    else:
        child.crashes += 1
        delay = min(MAX_RESTART_DELAY_S, FIRST_RESTART_DELAY_S * 2 ** (child.crashes - 1))
        report = log.error if child.crashes >= MAX_CRASHES_IN_A_ROW else log.warning
        report(
            "broker on port %d exited (status %s; crash %d in a row); restarting in %.0f s",
            child.port,
            status,
            child.crashes,
            delay,
        )
    child.restart_at = now + delay
    return child


def _start(config: Config, index: int, port: int) -> _Child:
    reports, report = _SPAWN.Pipe(duplex=False)
    process = _SPAWN.Process(
        target=run_broker,
        args=(
            config,
            index,
            port,
            metrics_port(config, index),
            report,
            registry_port(config, index),
        ),
        name=f"broker-{index}",
    )
    process.start()
    report.close()  # the child holds the writing end: its death shows here as end of file
    return _Child(index, port, process, time.monotonic(), reports)


def metrics_port(config: Config, index: int) -> int | None:
    """The metrics port of the ``index``-th broker (``None``: metrics are off)."""
    options = config.metrics
    if not options.enabled:
        return None
    return options.port + index if options.port else 0


def registry_port(config: Config, index: int) -> int | None:
    """The schema registry port of the ``index``-th broker (``None``: it serves none)."""
    options = config.schema_registry
    if not options.served:
        return None
    return options.port + index if options.port else 0


def _stop_all(children: list[_Child]) -> None:
    for child in children:
        if child.process.is_alive() and child.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                child.process.terminate()
    for child in children:
        child.process.join(STOP_TIMEOUT_S)
        if child.process.is_alive():
            child.process.kill()
            child.process.join()
