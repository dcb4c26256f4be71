"""``icefloe serve``: N broker processes on one machine, supervised by this one.

Each broker is a separate process (Python runs one core per process) listening on its own port,
``port``, ``port + 1``, …; clients bootstrap from the first. SIGTERM or Ctrl-C stops them all
cleanly: each stops accepting, commits what it buffered and deregisters. A broker that dies is
started again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import signal
import sys
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

from icefloe.broker.broker import Broker
from icefloe.config import Config

log = logging.getLogger(__name__)

_SPAWN = multiprocessing.get_context("spawn")
READY_TIMEOUT_S = 60.0
RESTART_DELAY_S = 1.0


@dataclass
class _Child:
    index: int
    port: int
    process: BaseProcess
    started: float


def run_broker(config: Config, port: int, ready: Any) -> None:
    """Body of a broker process: serve until SIGTERM/SIGINT, then stop cleanly."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s broker[%(process)d] %(message)s")

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        broker = await Broker.open(config)
        try:
            info = await broker.start(port)
            ready.put((info.node_id, info.host, info.port))
            await stop.wait()
        finally:
            await broker.stop()

    asyncio.run(main())


def serve(config: Config, brokers: int) -> int:
    """Run ``brokers`` broker processes until a signal; returns the exit status."""
    base = config.broker.port
    ready = _SPAWN.Queue()
    children = [_start(config, i, base + i, ready) for i in range(brokers)]
    try:
        started = [ready.get(timeout=READY_TIMEOUT_S) for _ in children]
    except Exception:  # noqa: BLE001 - queue.Empty or a dead child: report and stop all
        print("icefloe: brokers did not start; see the log above", file=sys.stderr)
        _stop_all(children)
        return 1
    host = started[0][1]
    ports = sorted(p for _, _, p in started)
    print(
        f"Icefloe is serving Kafka at {host}:{base} "
        f"({brokers} broker{'s' if brokers > 1 else ''} on ports {ports[0]}-{ports[-1]}; "
        f"data in {config.data_dir})",
        flush=True,
    )
    stopping = False

    def request_stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    while not stopping:
        time.sleep(0.2)
        for i, child in enumerate(children):
            if not stopping and not child.process.is_alive():
                log.warning(
                    "broker on port %d exited (%s); restarting", child.port, child.process.exitcode
                )
                time.sleep(RESTART_DELAY_S)
                children[i] = _start(config, child.index, child.port, ready)
    _stop_all(children)
    return 0


def _start(config: Config, index: int, port: int, ready: Any) -> _Child:
    process = _SPAWN.Process(target=run_broker, args=(config, port, ready), name=f"broker-{index}")
    process.start()
    return _Child(index, port, process, time.monotonic())


def _stop_all(children: list[_Child]) -> None:
    for child in children:
        if child.process.is_alive() and child.process.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                child.process.terminate()
    for child in children:
        child.process.join(30)
        if child.process.is_alive():
            child.process.kill()
            child.process.join()
