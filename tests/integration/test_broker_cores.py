"""`[broker] pin_to_core`: each broker process of `icefloe serve` on a core of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.broker import broker_pids, start_icefloe

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs Linux and at least two cores",
)


def test_each_broker_runs_on_a_core_of_its_own(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    running = start_icefloe(tmp_path / "data", brokers=2)
    try:
        affinities = [os.sched_getaffinity(pid) for pid in broker_pids(running)]
        assert all(len(affinity) == 1 for affinity in affinities)
        assert sorted(min(affinity) for affinity in affinities) == cores[:2]
        assert set(os.sched_getaffinity(running.process.pid)) == set(cores)  # serve itself: not
    finally:
        running.stop()
    log = running.log_path.read_text()
    assert f"broker 0 runs on core {cores[0]}" in log
    assert f"broker 1 runs on core {cores[1]}" in log


def test_pin_to_core_false_leaves_the_broker_on_every_core(tmp_path: Path) -> None:
    cores = os.sched_getaffinity(0)
    running = start_icefloe(tmp_path / "data", env={"ICEFLOE_BROKER__PIN_TO_CORE": "false"})
    try:
        (pid,) = broker_pids(running)
        assert os.sched_getaffinity(pid) == cores
    finally:
        running.stop()
    assert "runs on core" not in running.log_path.read_text()
