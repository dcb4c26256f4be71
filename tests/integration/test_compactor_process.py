"""A broker of `icefloe serve` runs its compactor in a process of its own, at a lower CPU
priority: the broker starts it again when it dies, it ends with its broker, and its compaction
metrics show on the broker's /metrics."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.test_metrics import create_topic, produce
from tests.support.broker import RunningIcefloe, broker_pids, child_pids, start_icefloe
from tests.support.metrics import scrape, total

COMPACT_SOON = {
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "1",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "0.5",
    # A killed compactor holds the compaction lease until its session expires.
    "ICEFLOE_COMPACTOR__LEASE_TTL_S": "2",
}
WITHIN_S = 60.0


def niceness(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[16])


def wait_for(check: Callable[[], bool], what: str, seconds: float = WITHIN_S) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what} within {seconds:.0f} s"
        time.sleep(0.2)


def compacted_bytes(url: str, topic: str) -> float:
    return total(scrape(url), "icefloe_compacted_wal_bytes_total", topic=topic)


def compactor_open(url: str) -> bool:
    return total(scrape(url), "icefloe_compactor_open") == 1


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for its parent counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.fixture
def running(tmp_path: Path) -> Iterator[RunningIcefloe]:
    icefloe = start_icefloe(tmp_path / "data", env=COMPACT_SOON)
    yield icefloe
    icefloe.stop()


def test_the_compactor_runs_beside_its_broker_at_a_lower_priority_and_ends_with_it(
    running: RunningIcefloe,
) -> None:
    [url] = running.metrics_urls
    [broker] = broker_pids(running)
    wait_for(lambda: compactor_open(url), "the compactor opened")
    [compactor] = child_pids(broker)
    assert niceness(compactor) == niceness(broker) + 10
    # The broker is pinned to one core, its compactor is not: it may use the others.
    assert os.sched_getaffinity(compactor) == os.sched_getaffinity(0)

    create_topic(running.bootstrap, "events")
    produce(running.bootstrap, "events", 500)
    wait_for(lambda: compacted_bytes(url, "events") > 0, "the compactor compacted")
    samples = scrape(url)  # what the compactor counted, on its broker's endpoint
    assert total(samples, "icefloe_object_store_requests_total", by="compaction", kind="PUT")
    assert total(samples, "icefloe_compactor_cpu_seconds_total") > 0
    assert total(samples, "icefloe_table_commit_seconds_count", format="iceberg") > 0

    os.kill(broker, signal.SIGKILL)  # no chance to stop it: the compactor must see for itself
    wait_for(lambda: gone(compactor), "the compactor ended", seconds=30)


def test_a_killed_compactor_is_started_again_and_compacts(running: RunningIcefloe) -> None:
    [url] = running.metrics_urls
    [broker] = broker_pids(running)
    wait_for(lambda: compactor_open(url), "the compactor opened")
    [first] = child_pids(broker)
    create_topic(running.bootstrap, "events")

    os.kill(first, signal.SIGKILL)
    wait_for(lambda: compactor_open(url), "the compactor opened again")
    produce(running.bootstrap, "events", 500)
    wait_for(lambda: compacted_bytes(url, "events") > 0, "the new compactor compacted")

    [second] = child_pids(broker)
    assert second != first
    assert total(scrape(url), "icefloe_compactor_restarts_total") == 1
    assert broker_pids(running) == [broker]  # the broker served on, untouched
    assert "the compactor's process exited (status -9)" in running.log_path.read_text()


def test_serve_stops_its_compactors_with_their_brokers(tmp_path: Path) -> None:
    running = start_icefloe(tmp_path / "data", brokers=2)
    try:
        for url in running.metrics_urls:
            wait_for(lambda url=url: compactor_open(url), "every compactor opened")
        compactors = [c for b in broker_pids(running) for c in child_pids(b)]
        assert len(compactors) == 2
    finally:
        assert running.stop() == 0
    assert all(gone(pid) for pid in compactors)


def test_a_compactor_inside_the_broker_compacts_too(tmp_path: Path) -> None:
    running = start_icefloe(
        tmp_path / "data", env=COMPACT_SOON | {"ICEFLOE_COMPACTOR__OWN_PROCESS": "false"}
    )
    try:
        [url] = running.metrics_urls
        [broker] = broker_pids(running)
        wait_for(lambda: compactor_open(url), "the compactor opened")
        create_topic(running.bootstrap, "events")
        produce(running.bootstrap, "events", 500)
        wait_for(lambda: compacted_bytes(url, "events") > 0, "the compactor compacted")
    finally:
        running.stop()
    log = running.log_path.read_text()
    assert f"broker[{broker}] this broker leads compaction" in log
    assert "compactor[" not in log
