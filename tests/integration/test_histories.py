"""Histories of real clients under faults, checked for every anomaly Kafka's guarantees forbid.

A short run of ``python -m tests.history.run``: three brokers, idempotent senders, a consumer
group polling read_committed, consume-transform-produce transactions in another group; a
broker SIGKILLed and a broker paused (SIGSTOP past its session) in turn. The whole history is
checked (lost, duplicated, reordered, skipped and aborted reads, dependency cycles), every key
must be readable to its end afterwards, and both tables must hold exactly what that read saw.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from tests.history.run import history_run

SECONDS = 100


def test_a_history_under_broker_kills_and_pauses_has_no_anomaly(tmp_path: Path) -> None:
    result = history_run(tmp_path / "run", SECONDS, ["kill", "pause"], seed=3)
    summary = json.dumps(asdict(result), indent=1)[:6000]

    kinds = [f["kind"] for f in result.faults]
    assert {"kill", "pause"} <= set(kinds), summary  # the faults happened
    assert result.check["stats"]["acknowledged_writes"] > 1000, summary
    assert result.valid, summary
