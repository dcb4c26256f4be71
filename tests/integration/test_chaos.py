"""Brokers killed under real clients: every acknowledged record of an idempotent producer is in
the stream once, at the offset it was acknowledged with, in the order it was sent, and in both
tables once within a minute of the last fault; a consumer group is handed every record.

A short round of ``python -m tests.chaos`` (which runs long ones): a 3-broker cluster, a broker
SIGKILLed every 10-15 s and once every process of the cluster at once.
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos.runs import broker_kill_round

SECONDS = 40
LEASE_S = "3"
"""Producer leases of killed brokers pass on after twice this: the default of 10 s would
leave most of a short round waiting for them (the takeover is the same)."""


def test_acknowledged_records_survive_broker_kills_once_each_in_order_and_in_both_tables(
    tmp_path: Path,
) -> None:
    result = broker_kill_round(
        tmp_path / "round",
        SECONDS,
        seed=7,
        group_protocol="consumer",  # KIP-848; the long runs alternate with classic groups
        env={"ICEFLOE_STORAGE__PRODUCER_LEASE_S": LEASE_S},
    )

    assert result.broker_kills >= 2, result.summary()  # the faults happened
    assert result.acknowledged > 1000, result.summary()
    assert not result.problems, result.summary()
