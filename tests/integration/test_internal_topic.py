"""The internal `__consumer_offsets` topic, as clients and Kafka 4.1.1's tools see it.

Metadata lists it as Kafka does (internal, 50 partitions, each with a leader); kafka-python's
pattern subscribers leave it out (librdkafka's match it, as against Kafka, and read nothing);
Produce, CreateTopics, DeleteTopics and DeleteRecords get Kafka's refusals; ListOffsets, Fetch
and DescribeConfigs answer for an empty, compacted log; kafka-topics lists and describes it.
One `icefloe serve` for the module.
"""

from __future__ import annotations

import datetime
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, OffsetSpec
from kafka import KafkaAdminClient, KafkaConsumer
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from icefloe.broker.protocol import make
from tests.support import admin_wire
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_jvm import TOPICS, KafkaTools, java_executable
from tests.support.kafka_wire import KafkaWire, batch_of, fetch_request, produce_request

OFFSETS = "__consumer_offsets"
TIMEOUT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("internal-topic") / "data")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def admin(cluster: RunningIcefloe) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


@pytest.fixture(scope="module")
def topic(cluster: RunningIcefloe, admin: AdminClient) -> str:
    """A topic with a record in each of its 2 partitions."""
    name = f"orders-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(TIMEOUT)
    producer = Producer({"bootstrap.servers": cluster.bootstrap})
    for partition in range(2):
        producer.produce(name, value=b"v", partition=partition)
    assert producer.flush(TIMEOUT) == 0
    return name


def metadata(cluster: RunningIcefloe, version: int, topics: Any) -> Any:
    schema = admin_wire.module(3, version)
    fields: dict[str, Any] = {"topics": topics, "allow_auto_topic_creation": True}
    if version >= 8:
        fields["include_topic_authorized_operations"] = False
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = False
    return admin_wire.call(cluster.bootstrap, make(schema.MetadataRequest, **fields))


def offsets_topic(response: Any) -> Any:
    (found,) = [t for t in response.topics if t.name == OFFSETS]
    return found


def test_metadata_lists_it_as_internal_with_50_led_partitions(
    cluster: RunningIcefloe, topic: str
) -> None:
    schema = admin_wire.module(3, 12)
    everything = metadata(cluster, 12, None)
    listed = offsets_topic(everything)
    assert (listed.error_code, listed.is_internal) == (ErrorCode.none, True)
    assert [p.partition_index for p in listed.partitions] == list(range(50))
    node_ids = {b.node_id for b in everything.brokers}
    assert all(p.leader_id in node_ids and p.error_code == 0 for p in listed.partitions)
    assert not next(t for t in everything.topics if t.name == topic).is_internal

    by_name = offsets_topic(
        metadata(cluster, 12, (schema.MetadataRequestTopic(name=OFFSETS, topic_id=None),))
    )
    assert (by_name.is_internal, by_name.topic_id) == (True, listed.topic_id)
    request = (schema.MetadataRequestTopic(name=None, topic_id=listed.topic_id),)
    (by_id,) = metadata(cluster, 12, request).topics
    assert (by_id.name, by_id.is_internal, len(by_id.partitions)) == (OFFSETS, True, 50)
    old = admin_wire.module(3, 1)
    (v1,) = metadata(cluster, 1, (old.MetadataRequestTopic(name=OFFSETS),)).topics
    assert (v1.error_code, v1.is_internal, len(v1.partitions)) == (ErrorCode.none, True, 50)


def test_kafka_python_describes_it_as_internal(cluster: RunningIcefloe) -> None:
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        (described,) = client.describe_topics([OFFSETS])
    finally:
        client.close()
    assert (described["error_code"], described["is_internal"]) == (0, True)
    assert len(described["partitions"]) == 50


def test_confluent_regex_subscription_matches_it_as_with_kafka(
    cluster: RunningIcefloe, topic: str
) -> None:
    """librdkafka does not leave internal topics out of a regex (only ``topic.blacklist``
    does), against Kafka as here: the consumer gets the internal partitions, which are empty,
    and reads the topic's records without an error."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"regex-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    received: list[tuple[str, int]] = []
    try:
        consumer.subscribe(["^.*"])
        deadline = time.monotonic() + TIMEOUT
        while len(received) < 2 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                received.append((message.topic(), message.partition()))
        assigned = {tp.topic for tp in consumer.assignment()}
    finally:
        consumer.close()
    assert sorted(received) == [(topic, 0), (topic, 1)]
    assert OFFSETS in assigned


def test_kafka_python_pattern_subscription_leaves_it_out(
    cluster: RunningIcefloe, topic: str
) -> None:
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.bootstrap,
        group_id=f"pattern-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
    )
    try:
        consumer.subscribe(pattern=".*")
        deadline = time.monotonic() + TIMEOUT
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(200)
        assigned = {tp.topic for tp in consumer.assignment()}
    finally:
        consumer.close()
    assert topic in assigned
    assert OFFSETS not in assigned


def test_produce_is_refused_as_kafka_refuses_it(cluster: RunningIcefloe) -> None:
    with KafkaWire(cluster.bootstrap) as wire:
        response = wire.request(produce_request(OFFSETS, 3, batch_of([b"forged"])))
    (answer,) = response.responses[0].partition_responses
    assert answer.error_code == ErrorCode.invalid_topic_exception
    assert answer.error_message == f"Cannot append to internal topic {OFFSETS}"

    failures: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "message.timeout.ms": 10_000})
    producer.produce(OFFSETS, b"forged", partition=0, on_delivery=lambda e, _m: failures.append(e))
    producer.flush(TIMEOUT)
    assert [e.code() for e in failures] == [KafkaError.TOPIC_EXCEPTION]


def test_list_offsets_and_fetch_answer_an_empty_log(
    cluster: RunningIcefloe, admin: AdminClient
) -> None:
    for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
        futures = admin.list_offsets({TopicPartition(OFFSETS, p): spec for p in (0, 49)})
        assert {f.result(TIMEOUT).offset for f in futures.values()} == {0}
    with KafkaWire(cluster.bootstrap) as wire:
        started = time.monotonic()
        response = wire.request(fetch_request(OFFSETS, 7, 0, max_wait_ms=300))
        waited = time.monotonic() - started
        (empty,) = response.responses[0].partitions
        (beyond,) = wire.request(fetch_request(OFFSETS, 7, 5)).responses[0].partitions
        (missing,) = wire.request(fetch_request(OFFSETS, 50, 0)).responses[0].partitions
    assert (empty.error_code, empty.high_watermark, empty.log_start_offset) == (0, 0, 0)
    assert not empty.records
    assert waited >= 0.25  # a long poll on an empty log waits, as in Kafka
    assert beyond.error_code == ErrorCode.offset_out_of_range
    assert missing.error_code == ErrorCode.unknown_topic_or_partition


def test_describe_configs_gives_cleanup_policy_compact(admin: AdminClient) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, OFFSETS)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["cleanup.policy"].value == "compact"


def test_create_delete_and_alter_are_refused(admin: AdminClient) -> None:
    created = admin.create_topics([NewTopic(OFFSETS, 1, 1), NewTopic("__consumer.offsets", 1, 1)])
    codes = {name: future.exception(TIMEOUT).args[0].code() for name, future in created.items()}
    assert codes == {
        OFFSETS: KafkaError.TOPIC_ALREADY_EXISTS,
        "__consumer.offsets": KafkaError.TOPIC_EXCEPTION,
    }
    deleted = admin.delete_topics([OFFSETS])[OFFSETS].exception(TIMEOUT)
    assert deleted.args[0].code() == KafkaError.INVALID_REQUEST
    grown = admin.create_partitions([NewPartitions(OFFSETS, 60)])[OFFSETS].exception(TIMEOUT)
    assert grown.args[0].code() == KafkaError.INVALID_REQUEST
    (deleting,) = admin.delete_records([TopicPartition(OFFSETS, 0, 0)]).values()
    assert deleting.exception(TIMEOUT).args[0].code() == KafkaError.TOPIC_EXCEPTION
    assert OFFSETS in admin.list_topics(timeout=TIMEOUT).topics


def test_create_topics_v7_says_why(cluster: RunningIcefloe) -> None:
    schema = admin_wire.module(19, 7)
    request = schema.CreateTopicsRequest(
        topics=(
            schema.CreatableTopic(
                name="__consumer.offsets",
                num_partitions=i32(1),
                replication_factor=-1,
                assignments=(),
                configs=(),
            ),
        ),
        timeout=datetime.timedelta(seconds=TIMEOUT),
        validate_only=True,
    )
    (result,) = admin_wire.call(cluster.bootstrap, request).topics
    assert result.error_code == ErrorCode.invalid_topic_exception
    assert (
        result.error_message
        == f"Topic '__consumer.offsets' collides with existing topic: {OFFSETS}"
    )


@pytest.fixture(scope="module")
def tools(cluster: RunningIcefloe) -> KafkaTools:
    java_executable()  # fails naming the fix if Java or the jars are missing
    return KafkaTools(cluster.bootstrap)


def test_kafka_topics_lists_and_describes_it(tools: KafkaTools, topic: str) -> None:
    listed = tools.run(TOPICS, "--list").split()
    assert OFFSETS in listed
    assert topic in listed
    assert OFFSETS not in tools.run(TOPICS, "--list", "--exclude-internal").split()
    described = tools.run(TOPICS, "--describe", "--topic", OFFSETS)
    header = described.splitlines()[0]
    assert f"Topic: {OFFSETS}" in header
    assert "PartitionCount: 50" in header
    assert "cleanup.policy=compact" in header
    assert sum(1 for line in described.splitlines() if "Leader:" in line) == 50
