"""`icefloe serve` on the embedded default, with a chosen flush profile, for the benchmark."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.http import get
from tests.support.servers import ROOT

COMPACT_AT_ONCE = {
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
}
"""Settings under which the background compactor turns the whole log into Parquet at once."""

TABLES_TIMEOUT_S = 120
START_TIMEOUT_S = 120
COMPACTOR_OPEN = "icefloe_compactor_open 1.0"
"""The line of a broker's /metrics once its compaction backends are open."""
POLL_INTERVAL_S = 1.0


@dataclass
class IcefloeServer:
    """A running `icefloe serve` (a supervisor and its broker processes)."""

    running: RunningIcefloe

    @property
    def bootstrap(self) -> str:
        return self.running.bootstrap

    def pids(self) -> list[int]:
        """The broker processes; their compaction workers are found under them."""
        return broker_pids(self.running)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.running.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        self.running.stop()


def setting(item: str) -> tuple[str, str]:
    """An ``ICEFLOE_KEY=VALUE`` item of a command line, as an argparse ``type``: a benchmark
    takes such items as settings for :func:`start` (``dict`` of them).

    Raises:
        argparse.ArgumentTypeError: ``item`` is not of that form.
    """
    key, sep, value = item.partition("=")
    if not sep or not key.startswith("ICEFLOE_"):
        raise argparse.ArgumentTypeError(f"{item!r}: expected ICEFLOE_KEY=VALUE")
    return key, value


def add_icefloe_env(parser: argparse.ArgumentParser, help: str) -> None:
    """A repeatable ``--icefloe-env ICEFLOE_KEY=VALUE`` option (:func:`setting`); ``dict`` of its
    list gives the settings for :func:`start`."""
    parser.add_argument(
        "--icefloe-env",
        action="append",
        default=[],
        type=setting,
        metavar="ICEFLOE_KEY=VALUE",
        help=f"{help} (repeatable)",
    )


def start(
    data_dir: Path,
    profile: str,
    brokers: int,
    settings: dict[str, str] | None = None,
    compact_at_once: bool = False,
) -> IcefloeServer:
    """Start (or restart, on an existing ``data_dir``) `icefloe serve` with ``profile`` and
    ``settings`` (``ICEFLOE_…`` environment variables)."""
    env = {"ICEFLOE_STORAGE__PROFILE": profile} | (settings or {})
    if compact_at_once:
        env |= COMPACT_AT_ONCE
    server = IcefloeServer(
        start_icefloe(data_dir, brokers=brokers, env=env, timeout=START_TIMEOUT_S)
    )
    if env.get("ICEFLOE_COMPACTOR__ENABLED", "true") != "false":
        try:
            _wait_for_compactors(server.running.metrics_urls, START_TIMEOUT_S)
        except BaseException:
            server.stop()
            raise
    return server


def _wait_for_compactors(metrics_urls: list[str], timeout: float) -> None:
    """Wait until every broker has opened its compactor.

    Brokers serve clients while they import and open the table formats' SDKs (seconds of CPU):
    the workloads measure a broker that has finished starting, as Kafka's has.
    """
    deadline = time.monotonic() + timeout
    waiting = list(metrics_urls)
    while True:
        waiting = [url for url in waiting if COMPACTOR_OPEN not in get(url)[1].splitlines()]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"compactors not open after {timeout:.0f} s: {waiting}")
        time.sleep(POLL_INTERVAL_S / 5)


class CompactionTimeout(RuntimeError):
    """The log was not all in Parquet in time."""


def wait_until_compacted(
    data_dir: Path, topic: str, timeout: float, settings: dict[str, str] | None = None
) -> float:
    """Seconds until `icefloe tables --json` shows no record of ``topic`` left outside tables
    (``settings``: the server's ``ICEFLOE_…`` variables, so that the command finds its stores)."""
    started = time.monotonic()
    last = "nothing yet"
    while time.monotonic() - started < timeout:
        lag, last = _topic_lag(data_dir, topic, settings or {})
        if lag == 0:
            return time.monotonic() - started
        time.sleep(POLL_INTERVAL_S)
    raise CompactionTimeout(f"{topic} not compacted after {timeout:.0f} s; last answer: {last}")


def _topic_lag(data_dir: Path, topic: str, settings: dict[str, str]) -> tuple[int | None, str]:
    """(records of ``topic`` not yet in its tables, or None if unknown; the raw answer)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env |= settings | {"ICEFLOE_DATA_DIR": str(data_dir)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "icefloe", "tables", "--json"],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=TABLES_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return None, f"`icefloe tables` took over {TABLES_TIMEOUT_S} s"
    raw = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
        return None, raw[-1000:]
    try:
        rows = json.loads(done.stdout)
        lags = [int(row["lag_records"]) for row in rows if row["topic"] == topic]
    except (ValueError, KeyError, TypeError):
        print(f"    could not parse `icefloe tables --json`: {raw[-1000:]!r}", flush=True)
        return None, raw[-1000:]
    return (max(lags) if lags else None), raw[-1000:]
