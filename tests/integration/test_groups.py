"""Consumer groups end to end with real clients: sharing, rebalancing, offsets, failover.

Every client library takes part: confluent-kafka with the classic protocol and with KIP-848
(``group.protocol=consumer``), kafka-python and aiokafka (classic).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.heartbeat.v3.request import HeartbeatRequest
from kio.schema.join_group.v5.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.sync_group.v3.request import SyncGroupRequest, SyncGroupRequestAssignment
from kio.static.primitive import i32

from icefloe.broker.protocol import make
from icefloe.cluster import BROKERS, BrokerInfo, rendezvous_owner
from icefloe.config import load_config
from icefloe.groups.coordinator import Lease, read_lease
from icefloe.groups.inspect import describe_group
from icefloe.storage.engine import StreamStorage
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.group_members import (
    BROKER_ENV,
    KINDS,
    Member,
    partitioned,
    produce,
    repeats,
    wait_until,
)
from tests.support.kafka_wire import KafkaWire
from tests.support.topics import create_topic

PARTITIONS = 12


@pytest.fixture(scope="module")
def icefloe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    """One cluster for the module's tests that need no restart: each has topics and groups of
    its own (named after the client library it runs)."""
    running = start_icefloe(tmp_path_factory.mktemp("groups") / "data", env=BROKER_ENV)
    yield running
    running.stop()


def values(members: list[Member]) -> Counter[bytes]:
    return Counter(value for m in members for _, _, value in m.consumed)


def expected(count: int) -> Counter[bytes]:
    return Counter(str(i).encode() for i in range(count))


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_members_share_partitions_rebalance_and_consume_each_record_once(
    icefloe: RunningIcefloe, kind: str
) -> None:
    topic, group = f"events-{kind}", f"shared-{kind}"
    create_topic(icefloe, topic, PARTITIONS)
    produce(icefloe.bootstrap, topic, range(0, 120), PARTITIONS)
    members = [Member(kind, icefloe.bootstrap, group, topic).start() for _ in range(3)]
    everyone = list(members)
    try:
        wait_until(lambda: partitioned(members, PARTITIONS), "3 members own 12 partitions")
        produce(icefloe.bootstrap, topic, range(120, 240), PARTITIONS)

        fourth = Member(kind, icefloe.bootstrap, group, topic).start()
        members.append(fourth)
        everyone.append(fourth)
        wait_until(lambda: partitioned(members, PARTITIONS), "a 4th member gets a share")

        leaving = members.pop(0)
        leaving.stop()
        wait_until(lambda: partitioned(members, PARTITIONS), "the rest take over its share")
        produce(icefloe.bootstrap, topic, range(240, 360), PARTITIONS)

        wait_until(lambda: set(values(everyone)) == set(expected(360)), "all 360 consumed")
    finally:
        for member in members:
            member.stop()
    assert not [e for m in everyone for e in m.errors]
    twice = repeats(everyone) or "none"
    assert values(everyone) == expected(360), f"every record once; more than once: {twice}"


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    """A cluster started again on the data of one whose brokers all stopped after a group of
    each client library had consumed (and committed) the first 40 records of its topic."""
    data = tmp_path_factory.mktemp("restarted") / "data"
    first = start_icefloe(data, env=BROKER_ENV)
    try:
        for kind in KINDS:
            consume_the_first_40(first, kind)
    finally:
        first.stop()
    second = start_icefloe(data, env=BROKER_ENV)
    yield second
    second.stop()


def consume_the_first_40(cluster: RunningIcefloe, kind: str) -> None:
    create_topic(cluster, f"log-{kind}", 4)
    produce(cluster.bootstrap, f"log-{kind}", range(0, 40), 4)
    before = Member(kind, cluster.bootstrap, f"resumer-{kind}", f"log-{kind}").start()
    wait_until(lambda: len(before.consumed) == 40, f"{kind}: the first 40 are consumed")
    before.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_committed_offsets_survive_a_restart_of_every_broker(
    restarted: RunningIcefloe, kind: str
) -> None:
    produce(restarted.bootstrap, f"log-{kind}", range(40, 80), 4)
    after = Member(kind, restarted.bootstrap, f"resumer-{kind}", f"log-{kind}").start()
    wait_until(lambda: len(after.consumed) >= 40, "the next 40 are consumed")
    after.stop()
    assert Counter(v for _, _, v in after.consumed) == expected(80) - expected(40)


def _store_state(data_dir: Path, group: str) -> tuple[list[BrokerInfo], Lease | None, int]:
    """(live brokers, the group's lease, its member count), read from the metadata store."""

    async def read() -> tuple[list[BrokerInfo], Lease | None, int]:
        config = load_config(env={}, overrides={"data_dir": str(data_dir)})
        async with await StreamStorage.open(config) as storage:
            records = await storage.metadata.scan(BROKERS, BROKERS[:-1] + "0")
            lease = await read_lease(storage.metadata, group)
            view = await describe_group(storage, group)
            return (
                [BrokerInfo.decode(r.value) for r in records],
                lease,
                len(view.members) if view else 0,
            )

    return asyncio.run(read())


_SILENT_MEMBER = textwrap.dedent(
    """
    import sys
    from confluent_kafka import Consumer
    c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
                  "client.id": "silent,zone_id=z2", "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([sys.argv[3]])
    while True:
        c.poll(0.1)
    """
)


@pytest.mark.slow
def test_group_survives_sigkill_of_the_broker_running_its_timers(tmp_path: Path) -> None:
    """Members talk to zone z2's broker; the lease holder is z1's broker, which is killed.

    A fourth member is then killed too, without leaving: only the group's timers can expel it,
    so the three others owning every partition again proves the timers moved to a live broker.
    """
    data = tmp_path / "data"
    env = {**BROKER_ENV, "ICEFLOE_BROKER__SESSION_TTL_S": "1.5"}
    z1 = start_icefloe(data, env={**env, "ICEFLOE_BROKER__ZONE": "z1"})
    z2 = start_icefloe(data, env={**env, "ICEFLOE_BROKER__ZONE": "z2"})
    members: list[Member] = []
    silent: subprocess.Popen[bytes] | None = None
    try:
        brokers, _, _ = _store_state(data, "-")
        z1_node = next(b.node_id for b in brokers if b.zone == "z1")
        # A group whose preferred lease holder is z1's broker, while its members (in zone z2)
        # are told z2's broker is their coordinator.
        group = next(
            g
            for g in (f"survivors-{i}" for i in range(100))
            if rendezvous_owner(f"group/{g}", brokers).node_id == z1_node
        )
        create_topic(z2, "work", 6)
        produce(z2.bootstrap, "work", range(0, 60), 6)
        members = [
            Member("confluent-classic", z2.bootstrap, group, "work", "app,zone_id=z2").start()
            for _ in range(3)
        ]
        silent = subprocess.Popen(
            [sys.executable, "-c", _SILENT_MEMBER, z2.bootstrap, group, "work"]
        )
        wait_until(lambda: _store_state(data, group)[2] == 4, "4 members joined")
        wait_until(
            lambda: (
                sum(len(m.assignment) for m in members) in (4, 5)
                and all(m.assignment for m in members)
            ),
            "the group is stable with 4 members",
        )
        _, lease, _ = _store_state(data, group)
        assert lease is not None
        assert lease.node_id == z1_node

        os.kill(lease.pid, signal.SIGKILL)
        silent.kill()
        wait_until(lambda: partitioned(members, 6), "the silent member is expelled", timeout=30)
        _, new_lease, _ = _store_state(data, group)
        assert new_lease is not None
        assert new_lease.pid != lease.pid

        produce(z2.bootstrap, "work", range(60, 120), 6)
        wait_until(lambda: set(values(members)) >= set(expected(120)), "everything consumed")
    finally:
        if silent is not None:
            silent.kill()
            silent.wait()
        for member in members:
            member.stop()
        z2.stop()
        z1.stop()
    assert not [e for m in members for e in m.errors]


LEADER_SESSION_MS = 6_000
LEADER_REBALANCE_MS = 300_000


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["confluent-classic", "kafka-python"])
def test_a_leader_gone_between_join_and_sync_is_replaced_at_its_session_timeout(
    icefloe: RunningIcefloe, kind: str
) -> None:
    """The leader of a rebalance stops (a pause, a crash) right after its JoinGroup answer.

    The follower waiting in SyncGroup for its assignment must not wait out the leader's
    rebalance timeout (five minutes here): the leader's session ends, it is removed, and the
    follower, alone now, gets every partition. The leader is a raw Kafka connection, so the
    test knows the group is waiting on it; the follower a real client.
    """
    topic = group = f"vanishing-leader-{kind}"
    create_topic(icefloe, topic, 2)
    produce(icefloe.bootstrap, topic, range(20), 2)
    with KafkaWire(icefloe.bootstrap) as leader:
        member_id = _lead_alone(leader, group, topic)
        follower = Member(kind, icefloe.bootstrap, group, topic).start()
        try:
            # Heartbeat until the follower's join starts a rebalance, then rejoin: the old
            # leader leads again, and the group waits on its assignment.
            wait_until(
                lambda: _heartbeat(leader, group, member_id, 1) is ErrorCode.rebalance_in_progress,
                "the follower's join starts a rebalance",
            )
            joined = leader.request(_join(group, member_id, topic))
            assert (joined.error_code, joined.leader) == (ErrorCode.none, member_id)
            assert len(joined.members) == 2  # the fault: the follower needs this leader's sync
            wait_until(
                lambda: len(follower.consumed) == 20,
                "the follower, alone, consumes every record",
                timeout=LEADER_SESSION_MS / 1000 + 30,
            )
        finally:
            follower.stop()
    assert sorted(value for _, _, value in follower.consumed) == sorted(expected(20))
    assert not follower.errors


def _lead_alone(leader: KafkaWire, group: str, topic: str) -> str:
    """Join as the group's only member and sync; the member id."""
    first = leader.request(_join(group, "", topic))
    assert first.error_code is ErrorCode.member_id_required
    joined = leader.request(_join(group, first.member_id, topic))
    assert (joined.error_code, joined.leader) == (ErrorCode.none, first.member_id)
    synced = leader.request(
        make(
            SyncGroupRequest,
            group_id=group,
            generation_id=joined.generation_id,
            member_id=first.member_id,
            group_instance_id=None,
            assignments=(SyncGroupRequestAssignment(member_id=first.member_id, assignment=b""),),
        )
    )
    assert synced.error_code is ErrorCode.none
    return str(first.member_id)


def _join(group: str, member_id: str, topic: str) -> JoinGroupRequest:
    name = topic.encode()
    subscription = struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)
    return make(
        JoinGroupRequest,
        group_id=group,
        session_timeout=datetime.timedelta(milliseconds=LEADER_SESSION_MS),
        rebalance_timeout=datetime.timedelta(milliseconds=LEADER_REBALANCE_MS),
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=(JoinGroupRequestProtocol(name="range", metadata=subscription),),
    )


def _heartbeat(leader: KafkaWire, group: str, member_id: str, generation: int) -> ErrorCode:
    time.sleep(0.5)
    request = HeartbeatRequest(
        group_id=group, generation_id=i32(generation), member_id=member_id, group_instance_id=None
    )
    return ErrorCode(leader.request(request).error_code)
