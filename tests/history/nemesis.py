"""Faults scheduled during a history run, each checked to have happened and noted with its
start and end (seconds on the history's clock), so the report can say what clients saw
during each one.

- ``kill``: SIGKILL one of ``serve``'s brokers at random (``serve`` starts it again).
- ``pause``: SIGSTOP one broker for longer than its metadata-store session and producer leases,
  then SIGCONT: it wakes up believing it still owns what others have taken over meanwhile.
- ``store-kill``: SIGKILL the metadata server (etcd, Oxia), start it again on its data after a
  few seconds.
- ``store-pause``: SIGSTOP the metadata server past every session's TTL, then SIGCONT.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Final

from tests.history.recorder import History
from tests.support.broker import RunningIcefloe, broker_pids
from tests.support.chaos import process_gone, process_stopped
from tests.support.servers import ServerProcess

KINDS: Final = ("kill", "pause", "store-kill", "store-pause")
STORE_KINDS: Final = ("store-kill", "store-pause")
EVERY_S: Final = (8.0, 14.0)
"""Seconds between the end of one fault and the start of the next (a range)."""
PAUSE_S: Final = (12.0, 18.0)
"""How long a paused process stays stopped: past the session TTL the runs configure."""
STORE_DOWN_S: Final = 3.0
"""How long a killed metadata server stays down."""


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    target: str
    began: float
    ended: float

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "target": self.target, "began": self.began, "ended": self.ended}


class Nemesis(threading.Thread):
    """Injects the given kinds of faults in turn, at random times, until stopped."""

    def __init__(
        self,
        running: RunningIcefloe,
        kinds: list[str],
        history: History,
        seed: int,
        store: ServerProcess | None = None,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        if store is None and set(kinds) & set(STORE_KINDS):
            raise ValueError("metadata-store faults need a metadata server (--store etcd|oxia)")
        self._running = running
        self._store = store
        self._kinds = kinds
        self._history = history
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self.faults: list[Fault] = []
        self.failures: list[str] = []
        """Faults that did not happen as they should (a run whose faults did not happen
        proves nothing)."""

    def run(self) -> None:
        n = 0
        while not self._stopping.wait(self._random.uniform(*EVERY_S)):
            kind = self._kinds[n % len(self._kinds)]
            began = self._history.now()
            if kind in STORE_KINDS:
                assert self._store is not None
                target = self._store.name
                if kind == "store-kill":
                    self._kill_store(self._store)
                else:
                    self._pause_store(self._store)
            else:
                pids = broker_pids(self._running)
                if not pids:
                    continue  # serve is starting them again
                pid = self._random.choice(pids)
                target = f"broker {pid}"
                if kind == "kill":
                    self._kill(pid)
                else:
                    self._pause(pid)
            self.faults.append(Fault(kind, target, began, self._history.now()))
            n += 1

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not process_gone(pid, 10.0):
            self.failures.append(f"broker {pid} was still alive 10 s after SIGKILL")

    def _pause(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        if not process_stopped(pid):
            self.failures.append(f"broker {pid} did not stop on SIGSTOP")
        # Sleep through the pause even when asked to stop: a broker left stopped would hang
        # the run's end.
        time.sleep(self._random.uniform(*PAUSE_S))
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            self.failures.append(f"broker {pid} died while paused")

    def _kill_store(self, store: ServerProcess) -> None:
        process = store.process
        assert process is not None
        store.kill()
        if process.poll() is None:
            self.failures.append(f"{store.name} survived SIGKILL")
        time.sleep(STORE_DOWN_S)
        store.start()

    def _pause_store(self, store: ServerProcess) -> None:
        process = store.process
        assert process is not None
        store.pause()
        if not process_stopped(process.pid):
            self.failures.append(f"{store.name} did not stop on SIGSTOP")
        time.sleep(self._random.uniform(*PAUSE_S))
        store.resume()

    def stop(self) -> None:
        self._stopping.set()
        self.join()
