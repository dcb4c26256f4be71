"""Zone tokens in client ids and rendezvous ownership."""

from __future__ import annotations

from collections import Counter

import pytest

from icefloe import cluster as cluster_module
from icefloe.cluster import BrokerInfo, Cluster, balanced_owners, client_zone, rendezvous_owner


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


def test_rendezvous_owner_is_stable_and_spread() -> None:
    three = brokers(3)
    owners = [rendezvous_owner(f"g/{k}", three).node_id for k in range(300)]
    assert owners == [rendezvous_owner(f"g/{k}", list(reversed(three))).node_id for k in range(300)]
    assert min(Counter(owners).values()) > 60  # roughly a third each


def test_removing_a_broker_moves_only_its_rendezvous_keys() -> None:
    three, two = brokers(3), brokers(2)
    for k in range(200):
        before = rendezvous_owner(f"g/{k}", three).node_id
        after = rendezvous_owner(f"g/{k}", two).node_id
        if before != 3:
            assert after == before


@pytest.mark.parametrize(("partitions", "count"), [(8, 2), (8, 3), (12, 5), (1, 3), (100, 7)])
def test_a_topics_partitions_are_spread_evenly(partitions: int, count: int) -> None:
    candidates = brokers(count)
    for topic in (f"topic-{n}" for n in range(50)):
        owners = [b.node_id for b in balanced_owners(topic, partitions, candidates)]
        loads = Counter(owners)
        share = -(-partitions // count)
        assert max(loads.values()) == share
        assert sum(loads.values()) == partitions


def test_partition_owners_do_not_depend_on_the_order_brokers_are_listed_in() -> None:
    four = brokers(4)
    for topic in ("a", "b", "orders"):
        assert balanced_owners(topic, 16, four) == balanced_owners(topic, 16, four[::-1])


def test_removing_a_broker_moves_its_partitions_and_few_others() -> None:
    """Rendezvous hashing with bounded loads: the removed broker's partitions move, and a
    few others, since the brokers left may each own more."""
    three, two = brokers(3), brokers(2)
    had, others_moved = 0, 0
    for topic in (f"topic-{n}" for n in range(100)):
        before = balanced_owners(topic, 12, three)
        after = balanced_owners(topic, 12, two)
        for old, new in zip(before, after, strict=True):
            if old.node_id == 3:
                had += 1
            elif new != old:
                others_moved += 1
    assert had == 100 * 4
    assert others_moved <= had // 4


def test_a_cluster_caches_a_topics_owners_and_forgets_them_past_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(metadata=None, session_ttl=1.0)  # type: ignore[arg-type]  # routing only
    cluster.me = brokers(1)[0]
    cluster._live = {b.node_id: b for b in brokers(3)}
    monkeypatch.setattr(cluster_module, "OWNERS_CACHED", 10)

    first = cluster.owners("a", 8, None)
    assert cluster.owners("a", 8, None) is first  # computed once
    assert cluster.owner("a", 8, 5, None) == first[5]
    cluster.owners("b", 8, None)  # 16 owners: past the bound, "a" goes
    assert cluster.owners("a", 8, None) is not first
    assert cluster.owners("a", 8, None) == first
