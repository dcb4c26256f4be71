"""Real servers for backend tests, started on 127.0.0.1 for the duration of a test session.

`scripts/install-servers` installs the programs (run by `scripts/test`); fixtures built on
:class:`ServerProcess` start them on free ports and stop them afterwards. A server that cannot
start is a test *error*, never a skip: a backend test must not pass without its backend.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".servers"
"""Where `scripts/install-servers` puts programs that are not on PATH (gitignored)."""


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def free_ports(count: int) -> list[int]:
    """``count`` different ports free on 127.0.0.1 now. Each is held until all are chosen:
    a port closed at once may be handed out again by the next bind (two listeners of one
    server then got the same port)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def find_program(name: str) -> str:
    """A program from PATH or from .servers/bin, or a clear error naming the install script."""
    found = shutil.which(name) or shutil.which(name, path=str(TOOLS / "bin"))
    if found is None:
        raise RuntimeError(f"{name} is not installed: run scripts/install-servers")
    return found


class ServerProcess:
    """A server child process with its log, readiness wait and clean stop."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        workdir: Path,
        ready: Callable[[], bool],
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.workdir = workdir
        self.ready = ready
        self.env = {**os.environ, **(env or {})}
        self.timeout = timeout
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ServerProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.workdir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # so stop() can signal the whole process group
        )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"{self.name} exited with {code}: {self.tail()}")
            try:
                if self.ready():
                    return self
            except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {self.timeout}s: {self.tail()}")

    def pause(self) -> None:
        """Freeze the server (SIGSTOP), e.g. to test an outage without losing its state;
        return once it is frozen."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not self.paused():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not stop on SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGCONT)

    def paused(self) -> bool:
        """Whether the server is frozen now (stopped by a signal, as :meth:`pause` leaves it)."""
        assert self.process is not None
        stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def kill(self, within: float = 10.0) -> int:
        """SIGKILL the server's whole process group, as a crash of its host would, and wait
        until it is gone (:meth:`start` starts it again on its data); its exit status, which
        says it was killed (``-9``). A process in the middle of a disk write dies only once
        the write is done: ``within`` bounds the wait."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait(within)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def discard(self) -> None:
        """Stop, then delete the server's folder (data and log): for servers that live as long
        as the test process, whose folders would otherwise pile up run after run."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def tail(self, lines: int = 20) -> str:
        try:
            return " | ".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"
