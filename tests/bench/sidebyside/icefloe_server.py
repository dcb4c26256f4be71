"""`icefloe serve` on the embedded default, with a chosen flush profile, for the benchmark."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass
from pathlib import Path

from icefloe.compaction.planner import read_backlog
from icefloe.config import Config, load_config
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.http import get

COMPACT_AT_ONCE = {
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
}
"""Settings under which the background compactor turns the whole log into Parquet at once."""

START_TIMEOUT_S = 120
COMPACTOR_OPEN = "icefloe_compactor_open 1.0"
"""The line of a broker's /metrics once its compaction backends are open."""
POLL_INTERVAL_S = 0.2


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
        # A session of its own, as Kafka's broker has: where the kernel groups CPU time by
        # session (autogroup), each server then competes with the clients as one group.
        start_icefloe(
            data_dir,
            brokers=brokers,
            env=env,
            timeout=START_TIMEOUT_S,
            own_session=True,
            yielding=True,
        )
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
        time.sleep(POLL_INTERVAL_S)


class CompactionTimeout(RuntimeError):
    """The log was not all in Parquet in time."""


def wait_until_compacted(
    data_dir: Path, topic: str, timeout: float, settings: dict[str, str] | None = None
) -> float:
    """Seconds until no record of ``topic`` is left outside its tables (``settings``: the
    server's ``ICEFLOE_…`` variables, so that the reader finds the server's stores).

    The backlog is read here, from the offset index the server's compaction updates, as
    `icefloe tables` reads it: a command started every poll would spend a second of CPU on
    its imports each time, on the cores the compaction it waits for runs on.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    env |= (settings or {}) | {"ICEFLOE_DATA_DIR": str(data_dir)}
    config = load_config(env=env)
    started = time.monotonic()
    lag = asyncio.run(_lag_when_done(config, topic, deadline=started + timeout))
    if lag != 0:
        last = "no such topic" if lag is None else f"{lag} records not in tables"
        raise CompactionTimeout(f"{topic} not compacted after {timeout:.0f} s; {last}")
    return time.monotonic() - started


async def _lag_when_done(config: Config, topic_name: str, deadline: float) -> int | None:
    """Records of the topic not in its tables: 0 once compacted, else what is left at the
    deadline (None: no such topic)."""
    lag: int | None = None
    topic = None
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage, config.table.identifier)
        await topics.start()
        try:
            while time.monotonic() < deadline:
                topic = topics.get_cached(topic_name)
                if topic is not None:
                    # WAL entries always follow those in tables: the stream is compacted once
                    # its last entry is in tables. One read a stream, where reading every
                    # entry each poll took a good share of a core beside the compaction timed.
                    lasts = [await storage.index.last_entry(s) for s in topic.streams]
                    if not any(e is not None and e.in_wal for e in lasts):
                        return 0
                await asyncio.sleep(POLL_INTERVAL_S)
            if topic is not None:  # what is left, for the message
                lag = 0
                for stream in topic.streams:
                    lag += (await read_backlog(storage.index, stream, None)).records
        finally:
            await topics.close()
    return lag
