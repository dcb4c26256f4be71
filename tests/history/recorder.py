"""Recording a history: every client operation, as invoked and as completed.

Workers call :meth:`History.record` once an operation is over, with the times it began and
ended: an operation seen only from inside a client callback (a rebalance in the middle of a
poll) can then be split at the callback's time truthfully. Events go to a spool file as they
come (a run's history is not held in memory); :meth:`History.close` writes the history file,
its events in time order and numbered, in the format :mod:`tests.history.model` reads.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

OK: Final = "ok"
FAIL: Final = "fail"
"""The operation certainly did not happen (a transaction aborted, a send refused unwritten)."""
INFO: Final = "info"
"""The outcome is unknown: it may or may not have happened (a timeout, a client that died)."""


@dataclass(frozen=True, slots=True)
class Completed:
    """One operation, from invocation to completion."""

    process: int
    f: str
    invoked: float
    invoke_value: Any
    completed: float
    type: str
    value: Any
    error: str | None = None
    """Why it failed or its outcome is unknown, as the client said."""


class History:
    """A thread-safe recorder of operations, one spool line per event, times from ``began``."""

    def __init__(self, path: Path, began: float | None = None) -> None:
        self.path = path
        self.began = time.monotonic() if began is None else began
        self._spool_path = path.with_suffix(".spool")
        self._spool = self._spool_path.open("w")
        self._lock = threading.Lock()
        self._processes = itertools.count()
        self._order = itertools.count()
        self.operations = 0

    def now(self) -> float:
        """Seconds since the run began (what the history's ``time`` holds)."""
        return time.monotonic() - self.began

    def new_process(self) -> int:
        """A process number for a new client (a client recreated after a crash gets a new one,
        so that no process has two operations outstanding)."""
        return next(self._processes)

    def record(self, op: Completed) -> None:
        if op.completed < op.invoked:
            raise ValueError(f"operation {op.f} of process {op.process} ends before it begins")
        with self._lock:
            for when, kind, value in (
                (op.invoked, "invoke", op.invoke_value),
                (op.completed, op.type, op.value),
            ):
                # The sequence number keeps an operation's invocation before its completion
                # when both have the same time, and the order of a process's operations.
                line = {"t": when, "s": next(self._order), "process": op.process, "f": op.f}
                line |= {"type": kind, "value": value}
                if kind != "invoke" and op.error is not None:
                    line["error"] = op.error
                self._spool.write(json.dumps(line) + "\n")
            self.operations += 1

    def close(self) -> Path:
        """Write the history file (events in time order, numbered) and remove the spool."""
        with self._lock:
            self._spool.close()
            events = [json.loads(line) for line in self._spool_path.open()]
        events.sort(key=lambda e: (e["t"], e["s"]))
        with self.path.open("w") as out:
            for index, e in enumerate(events):
                line = {"index": index, "time": round(e["t"], 6), "process": e["process"]}
                line |= {"type": e["type"], "f": e["f"], "value": e["value"]}
                if "error" in e:
                    line["error"] = e["error"]
                out.write(json.dumps(line) + "\n")
        self._spool_path.unlink()
        return self.path
