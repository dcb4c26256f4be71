"""`icefloe serve` as a user runs it, for end-to-end tests with real Kafka clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.servers import free_port, port_open

READY_LINE = "Icefloe is serving Kafka at "
METRICS_LINE = "Metrics and health: "
REGISTRY_LINE = "Schema registry: "
UNHANDLED_ERRORS = ("Traceback", "Fatal error on transport", "Exception in callback")
"""What a broker's log shows of an error nothing handled: a traceback, or the event loop's own
reports, which carry none when the loop made the exception itself (uvloop's do)."""


@dataclass
class RunningIcefloe:
    """A running `icefloe serve`: its bootstrap address, broker ports and process."""

    process: subprocess.Popen[str]
    host: str
    port: int
    brokers: int
    data_dir: Path
    log_path: Path
    output: list[str] = field(default_factory=list)
    metrics_urls: list[str] = field(default_factory=list)
    """Each broker's /metrics address, as `serve` printed them."""
    registry_urls: list[str] = field(default_factory=list)
    """Each broker's schema registry address, as `serve` printed them."""

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def broker_address(self, index: int) -> str:
        return f"{self.host}:{self.port + index}"

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM, as an operator would; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def unhandled_errors(log: str) -> list[str]:
    """Excerpts of ``log`` around every :data:`UNHANDLED_ERRORS` mark (one mark after the
    other)."""
    excerpts = []
    for mark in UNHANDLED_ERRORS:
        at = log.find(mark)
        while at != -1:
            excerpts.append(log[max(at - 300, 0) : at + 3000])
            at = log.find(mark, at + len(mark))
    return excerpts


def broker_pids(running: RunningIcefloe) -> list[int]:
    """Process ids of the broker processes `serve` runs now (its spawned children)."""
    pid = running.process.pid
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return []
    brokers = []
    for child in children:
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        # multiprocessing also spawns a resource tracker; brokers run spawn_main.
        if b"spawn_main" in command:
            brokers.append(int(child))
    return sorted(brokers)


def child_pids(pid: int) -> list[int]:
    """Process ids of the processes ``pid`` started (from any of its threads): a broker's
    compactor process, or a compactor's workers."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return sorted(children)


PORT_ATTEMPTS = 3


def start_icefloe(
    data_dir: Path,
    *,
    brokers: int = 1,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    own_session: bool = False,
    yielding: bool = False,
    port: int | None = None,
) -> RunningIcefloe:
    """Start `icefloe serve` on free ports and wait until it prints its bootstrap address
    (``own_session``: in a session of its own, as a service runs, rather than the caller's;
    ``port``: from that port on, as a cluster restarted where its clients look for it).

    Its compactor yields to a busy host only with ``yielding`` (benchmarks): two test workers
    keep the machine's cores busy, so a test's compaction would wait its longest every time
    (tests/compaction/test_yielding.py tests yielding).

    A port that looked free may be taken by another test's server before the broker binds it;
    then the run is started again on other ports (on ``port`` again, a second later).
    """
    attempt = 1
    while True:
        try:
            return _start_once(data_dir, brokers, env, timeout, own_session, yielding, port)
        except RuntimeError as exc:
            # serve words it "port N on HOST is already in use"; a raw bind error, "address
            # already in use".
            if "already in use" not in str(exc) or attempt == PORT_ATTEMPTS:
                raise
            if port is not None:
                time.sleep(1)  # a killed broker's socket, about to be released
        attempt += 1


def _start_once(
    data_dir: Path,
    brokers: int,
    env: dict[str, str] | None,
    timeout: float,
    own_session: bool,
    yielding: bool,
    fixed_port: int | None,
) -> RunningIcefloe:
    port = fixed_port or _free_port_run(brokers)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    # Tests want quick acknowledgements more than few WAL objects.
    environment.setdefault("ICEFLOE_STORAGE__PROFILE", "latency")
    environment.setdefault("ICEFLOE_METRICS__PORT", "0")  # free ports, printed by serve
    environment.setdefault("ICEFLOE_SCHEMA_REGISTRY__PORT", "0")
    if not yielding:
        environment.setdefault("ICEFLOE_COMPACTOR__YIELD_ABOVE_CPU", "1")
    environment.update(env or {})
    if fixed_port is None:
        log_path = data_dir.parent / f"{data_dir.name}-serve.log"
        log = log_path.open("w")
    else:  # one log per port, kept across restarts on it
        log_path = data_dir.parent / f"{data_dir.name}-{port}-serve.log"
        log = log_path.open("a")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "icefloe",
            "serve",
            "--data-dir",
            str(data_dir),
            "--port",
            str(port),
            "--brokers",
            str(brokers),
        ],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=own_session,
    )
    running = RunningIcefloe(process, "127.0.0.1", port, brokers, data_dir, log_path)
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        running.output.append(line)
        if line.startswith(READY_LINE) and all(port_open(port + i) for i in range(brokers)):
            if environment.get("ICEFLOE_METRICS__ENABLED", "true") != "false":
                metrics_line = process.stdout.readline()  # printed right after
                running.output.append(metrics_line)
                running.metrics_urls = metrics_line.removeprefix(METRICS_LINE).strip().split(", ")
            if environment.get("ICEFLOE_SCHEMA_REGISTRY__ENABLED", "true") != "false" and not (
                environment.get("ICEFLOE_SCHEMA_REGISTRY__URL")
            ):
                line = process.stdout.readline()  # printed after the metrics line
                running.output.append(line)
                running.registry_urls = line.removeprefix(REGISTRY_LINE).strip().split(", ")
            return running
    running.stop()
    raise RuntimeError(f"icefloe serve did not start: {log_path.read_text()[-3000:]}")


def _free_port_run(count: int) -> int:
    """A port p such that p … p+count-1 all look free."""
    for _ in range(50):
        port = free_port()
        if port + count < 65535 and not any(port_open(port + i) for i in range(count)):
            return port
    raise RuntimeError("no run of free ports found")


@pytest.fixture
def icefloe(tmp_path: Path) -> Iterator[RunningIcefloe]:
    """One broker on the embedded default, in a fresh data directory."""
    running = start_icefloe(tmp_path / "data")
    yield running
    running.stop()


@pytest.fixture
def icefloe_two_brokers(tmp_path: Path) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path / "data", brokers=2)
    yield running
    running.stop()
