"""The clock the history runs skew brokers with: a process started with it sees its wall
clock shifted by what its file says, its monotonic clock untouched, and says it saw it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.history.environment import SKEWED_CLOCK

PROBE = """
import os, sys, time
folder = os.environ["SKEWED_CLOCK_DIR"]
before = time.time() - time.monotonic()
with open(os.path.join(folder, str(os.getpid())), "w") as f:
    f.write("-120.5")
time.sleep(0.3)
after = time.time() - time.monotonic()
print(round(after - before, 1), abs(time.time_ns() / 1e9 - time.time()) < 0.1)
"""


def test_a_process_sees_its_own_shift_and_reports_it(tmp_path: Path) -> None:
    env = {**os.environ, "SKEWED_CLOCK_DIR": str(tmp_path), "PYTHONPATH": str(SKEWED_CLOCK)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["-120.5", "True"]  # time and time_ns agree
    (seen,) = tmp_path.glob("*.seen")
    assert seen.read_text() == "-120.5\n"


def test_without_the_folder_nothing_is_shifted(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SKEWED_CLOCK)}
    env.pop("SKEWED_CLOCK_DIR", None)
    code = "import time; print(time.time.__module__)"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == "time"
