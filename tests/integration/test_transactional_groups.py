"""Exactly-once with consumer groups (KIP-447) through real clients against `icefloe serve`:
a member a rebalance left behind cannot commit offsets in a transaction (its producer's
transaction must abort), and a consumer reading committed offsets with require_stable waits
while a transaction's offsets for its partitions are pending, for both group protocols."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from icefloe.broker.protocol import make
from tests.integration.test_transactions import create, transactional
from tests.support import admin_wire
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.group_members import BROKER_ENV, HEARTBEAT_MS, SESSION_TIMEOUT_MS

PROTOCOLS = ("classic", "consumer")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(
        tmp_path_factory.mktemp("txn-groups") / "data", brokers=2, env=dict(BROKER_ENV)
    )
    try:
        yield running
    finally:
        running.stop()


def member(cluster: RunningIcefloe, group: str, protocol: str, **settings: Any) -> Consumer:
    conf: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "group.protocol": protocol,
        "enable.auto.commit": False,
        **settings,
    }
    if protocol == "classic":
        conf |= {"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": HEARTBEAT_MS}
    return Consumer(conf)


def settle(consumers: list[Consumer], partitions: int, timeout: float = 60) -> None:
    """Poll every consumer until each owns some of the topic's partitions and none is owned
    twice."""
    deadline = time.monotonic() + timeout
    while True:
        for c in consumers:
            c.poll(0.05)
        owned = [tp.partition for c in consumers for tp in c.assignment()]
        if sorted(owned) == list(range(partitions)) and all(c.assignment() for c in consumers):
            return
        assert time.monotonic() < deadline, f"the group did not settle: {owned}"


def refused(producer: Producer, offsets: list[TopicPartition], group_metadata: Any) -> KafkaError:
    """The error send_offsets_to_transaction fails with; the transaction is aborted after."""
    with pytest.raises(KafkaException) as failed:
        producer.send_offsets_to_transaction(offsets, group_metadata, 30)
    error: KafkaError = failed.value.args[0]
    assert error.txn_requires_abort(), error  # abortable: the producer lives on
    producer.abort_transaction(30)
    return error


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_member_a_rebalance_left_behind_cannot_commit_in_a_transaction(
    cluster: RunningIcefloe, protocol: str
) -> None:
    topic, group = f"fenced-{protocol}", f"fenced-{protocol}"
    create(cluster, topic, 2)
    first = member(cluster, group, protocol)
    first.subscribe([topic])
    settle([first], 2)
    before = first.consumer_group_metadata()  # generation (member epoch) 1
    second = member(cluster, group, protocol)
    second.subscribe([topic])
    settle([first, second], 2)  # a rebalance moved a partition: first is at a new generation
    producer = transactional(cluster, f"fenced-{protocol}")
    offsets = [TopicPartition(topic, 0, 3)]

    producer.begin_transaction()
    assert refused(producer, offsets, before).code() == KafkaError.ILLEGAL_GENERATION

    producer.begin_transaction()
    producer.send_offsets_to_transaction(offsets, first.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    assert second.committed([TopicPartition(topic, 0)], timeout=30)[0].offset == 3

    current = first.consumer_group_metadata()
    first.close()  # leaves the group
    producer.begin_transaction()
    assert refused(producer, offsets, current).code() == KafkaError.UNKNOWN_MEMBER_ID
    second.close()


def test_a_static_member_taken_over_by_a_new_instance_is_fenced(cluster: RunningIcefloe) -> None:
    create(cluster, "fenced-static", 1)
    old = member(cluster, "fenced-static", "classic", **{"group.instance.id": "worker-1"})
    old.subscribe(["fenced-static"])
    settle([old], 1)
    metadata = old.consumer_group_metadata()
    old.close()  # a static member does not leave: its instance id stays in the group
    new = member(cluster, "fenced-static", "classic", **{"group.instance.id": "worker-1"})
    new.subscribe(["fenced-static"])
    settle([new], 1)
    producer = transactional(cluster, "fenced-static")
    producer.begin_transaction()
    error = refused(producer, [TopicPartition("fenced-static", 0, 1)], metadata)
    assert error.code() == KafkaError.FENCED_INSTANCE_ID
    new.close()


@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_committed_offsets_wait_for_the_transaction_that_may_change_them(
    cluster: RunningIcefloe, outcome: str
) -> None:
    topic = group = f"pending-{outcome}"
    create(cluster, topic, 1)
    partition = [TopicPartition(topic, 0)]
    # read_committed (librdkafka's default) asks for stable offsets; read_uncommitted does not.
    stable = member(cluster, group, "classic")
    unstable = member(cluster, group, "classic", **{"isolation.level": "read_uncommitted"})
    producer = transactional(cluster, f"pending-{outcome}")
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 4)], stable.consumer_group_metadata(), 30
    )
    producer.commit_transaction(30)

    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 9)], stable.consumer_group_metadata(), 30
    )
    # The client retries UNSTABLE_OFFSET_COMMIT until its timeout.
    with pytest.raises(KafkaException) as waited:
        stable.committed(partition, timeout=2)
    assert waited.value.args[0].code() == KafkaError._TIMED_OUT
    assert unstable.committed(partition, timeout=30)[0].offset == 4
    if outcome == "commit":
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)
    expected = 9 if outcome == "commit" else 4
    assert stable.committed(partition, timeout=30)[0].offset == expected
    stable.close()
    unstable.close()


def offset_fetch(cluster: RunningIcefloe, version: int, group: str, stable: bool, **kw: Any) -> Any:
    m = admin_wire.module(9, version)
    if version < 8:
        topics = (
            tuple(
                make(m.OffsetFetchRequestTopic, name=name, partition_indexes=tuple(map(i32, ps)))
                for name, ps in kw["topics"].items()
            )
            if kw.get("topics") is not None
            else None
        )
        return admin_wire.call(
            cluster.bootstrap,
            make(m.OffsetFetchRequest, group_id=group, topics=topics, require_stable=stable),
        )
    topics = (
        tuple(
            make(m.OffsetFetchRequestTopics, name=name, partition_indexes=tuple(map(i32, ps)))
            for name, ps in kw["topics"].items()
        )
        if kw.get("topics") is not None
        else None
    )
    wanted = make(m.OffsetFetchRequestGroup, group_id=group, topics=topics)
    response = admin_wire.call(
        cluster.bootstrap, make(m.OffsetFetchRequest, groups=(wanted,), require_stable=stable)
    )
    (answer,) = response.groups
    assert answer.error_code is ErrorCode.none
    return answer


def answers(response: Any) -> dict[tuple[str, int], tuple[int, ErrorCode]]:
    return {
        (t.name, int(p.partition_index)): (int(p.committed_offset), p.error_code)
        for t in response.topics
        for p in t.partitions
    }


@pytest.mark.parametrize("version", [7, 8, 9])
def test_offset_fetch_answers_unstable_for_pending_partitions_only(
    cluster: RunningIcefloe, version: int
) -> None:
    topic = group = f"unstable-v{version}"
    create(cluster, topic, 2)
    outsider = member(cluster, group, "classic")  # commits without joining: no generation
    producer = transactional(cluster, f"unstable-v{version}")
    producer.begin_transaction()
    committed = [TopicPartition(topic, 0, 3), TopicPartition(topic, 1, 5)]
    producer.send_offsets_to_transaction(committed, outsider.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction(
        [TopicPartition(topic, 0, 8)], outsider.consumer_group_metadata(), 30
    )
    pending, settled = (topic, 0), (topic, 1)
    named = {topic: [0, 1]}
    for topics in (named, None):  # the partitions named, and every committed offset
        got = answers(offset_fetch(cluster, version, group, True, topics=topics))
        assert got == {
            pending: (-1, ErrorCode.unstable_offset_commit),
            settled: (5, ErrorCode.none),
        }
        got = answers(offset_fetch(cluster, version, group, False, topics=topics))
        assert got == {pending: (3, ErrorCode.none), settled: (5, ErrorCode.none)}
    producer.commit_transaction(30)
    got = answers(offset_fetch(cluster, version, group, True, topics=named))
    assert got == {pending: (8, ErrorCode.none), settled: (5, ErrorCode.none)}
    outsider.close()
