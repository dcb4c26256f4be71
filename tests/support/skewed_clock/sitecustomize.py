"""Loaded at start-up by every Python process whose ``PYTHONPATH`` holds this folder (the
history runs' brokers): their wall clock (``time.time``, ``time.time_ns``) is shifted by the
number of seconds in the file ``$SKEWED_CLOCK_DIR/<pid>``, if there is one, as an NTP
step or a drifting host would shift it. The monotonic clock is left alone, as such steps leave
it. The file is read again at most every ``REREAD_S``; once a process has seen a non-zero
shift it writes ``<pid>.seen``, so that the fault can be proven to have happened.

Only Python code sees the shift (not C or Rust libraries, nor the JVM): what Icefloe decides
with wall-clock time (leases, deadlines, retention, timestamps) is all in Python.
"""

from __future__ import annotations

import os
import time

REREAD_S = 0.2
_folder = os.environ.get("SKEWED_CLOCK_DIR")

if _folder:
    _real_time, _real_time_ns, _monotonic = time.time, time.time_ns, time.monotonic
    _state = {"read_at": -1.0, "shift": 0.0, "seen": 0.0}

    def _shift() -> float:
        now = _monotonic()
        if now - _state["read_at"] >= REREAD_S:
            _state["read_at"] = now
            path = os.path.join(_folder, str(os.getpid()))
            try:
                with open(path) as file:
                    _state["shift"] = float(file.read().strip() or 0)
            except (OSError, ValueError):
                _state["shift"] = 0.0
            if _state["shift"] and _state["shift"] != _state["seen"]:
                _state["seen"] = _state["shift"]
                try:
                    with open(path + ".seen", "a") as file:
                        file.write(f"{_state['shift']}\n")
                except OSError:
                    pass
        return _state["shift"]

    def _time() -> float:
        return _real_time() + _shift()

    def _time_ns() -> int:
        return _real_time_ns() + int(_shift() * 1e9)

    time.time = _time
    time.time_ns = _time_ns
