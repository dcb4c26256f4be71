"""Zone tokens in client ids and rendezvous ownership."""

from __future__ import annotations

from collections import Counter

import pytest

from icefloe.cluster import BrokerInfo, client_zone, rendezvous_owner


@pytest.mark.parametrize(
    ("client_id", "zone"),
    [
        ("app,zone_id=z1", "z1"),
        ("zone_id=use1-az1,app", "use1-az1"),
        ("ws_az=us-east-1a", "us-east-1a"),
        ("warpstream_az=a,x=y", "a"),
        ("x,zone=eu-1b", "eu-1b"),
        ("automq_az=cn-1", "cn-1"),
        ("app", None),
        ("", None),
        (None, None),
        ("zone_id=", None),
        ("my_zone_id=z9", None),
    ],
)
def test_client_zone_tokens(client_id: str | None, zone: str | None) -> None:
    assert client_zone(client_id) == zone


def brokers(n: int) -> list[BrokerInfo]:
    return [BrokerInfo(i, "127.0.0.1", 9000 + i, None) for i in range(1, n + 1)]


def test_owner_is_stable_and_spread() -> None:
    three = brokers(3)
    owners = [rendezvous_owner(f"t/{p}", three).node_id for p in range(300)]
    assert owners == [rendezvous_owner(f"t/{p}", list(reversed(three))).node_id for p in range(300)]
    assert min(Counter(owners).values()) > 60  # roughly a third each


def test_removing_a_broker_moves_only_its_partitions() -> None:
    three, two = brokers(3), brokers(2)
    for p in range(200):
        before = rendezvous_owner(f"t/{p}", three).node_id
        after = rendezvous_owner(f"t/{p}", two).node_id
        if before != 3:
            assert after == before
