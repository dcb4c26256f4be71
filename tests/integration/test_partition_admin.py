"""DeleteRecords, DescribeProducers and DescribeLogDirs through real clients (confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient) and a bare socket for the answers the clients do
not show (Fetch and Produce log start offsets, absurd requests).

One `icefloe serve` is shared by the module's tests; each test works on its own topic.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import KafkaAdminClient
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32, i64

from tests.support import admin_wire
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_wire import KafkaWire, batch_of, fetch_request, produce_request
from tests.support.topics import own_topic_name

TIMEOUT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("partition-admin") / "data")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def confluent(cluster: RunningIcefloe) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


@pytest.fixture(scope="module")
def kafka_python(cluster: RunningIcefloe) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=TIMEOUT * 1000)
    yield admin
    admin.close()


@pytest.fixture
def topic(request: pytest.FixtureRequest, confluent: AdminClient) -> str:
    """A topic of this test's own, two partitions, ten records in partition 0."""
    name = own_topic_name(request)
    configs = {"cleanup.policy": "compact"} if "compact" in name else {}
    confluent.create_topics([NewTopic(name, 2, config=configs)])[name].result(TIMEOUT)
    producer = Producer({"bootstrap.servers": confluent_bootstrap(confluent)})
    for i in range(10):
        producer.produce(name, value=b"v%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0
    return name


def confluent_bootstrap(admin: AdminClient) -> str:
    brokers = admin.list_topics(timeout=TIMEOUT).brokers
    broker = next(iter(brokers.values()))
    return f"{broker.host}:{broker.port}"


def delete(admin: AdminClient, topic: str, partition: int, offset: int) -> int:
    """The low watermark confluent-kafka's delete_records answers."""
    (future,) = admin.delete_records([TopicPartition(topic, partition, offset)]).values()
    return int(future.result(TIMEOUT).low_watermark)


def delete_error(admin: AdminClient, topic: str, partition: int, offset: int) -> int:
    (future,) = admin.delete_records([TopicPartition(topic, partition, offset)]).values()
    with pytest.raises(KafkaException) as raised:
        future.result(TIMEOUT)
    return int(raised.value.args[0].code())


def earliest(admin: AdminClient, topic: str, partition: int = 0) -> int:
    wanted = {TopicPartition(topic, partition): OffsetSpec.earliest()}
    (future,) = admin.list_offsets(wanted).values()
    return int(future.result(TIMEOUT).offset)


def fetch(cluster: RunningIcefloe, topic: str, offset: int) -> tuple[int, int, int]:
    """(error code, log start offset, high watermark) of a Fetch of partition 0."""
    with KafkaWire(cluster.bootstrap) as wire:
        response = wire.request(fetch_request(topic, 0, offset))
    (answer,) = response.responses[0].partitions
    return int(answer.error_code), int(answer.log_start_offset), int(answer.high_watermark)


# --- DeleteRecords ---------------------------------------------------------------------------


def test_confluent_delete_records_moves_the_log_start_for_list_offsets_and_fetch(
    cluster: RunningIcefloe, confluent: AdminClient, topic: str
) -> None:
    assert delete(confluent, topic, 0, 4) == 4
    assert earliest(confluent, topic) == 4
    assert fetch(cluster, topic, 4) == (ErrorCode.none, 4, 10)
    assert fetch(cluster, topic, 3)[0] == ErrorCode.offset_out_of_range
    # Produce answers the new log start too.
    with KafkaWire(cluster.bootstrap) as wire:
        produced = wire.request(produce_request(topic, 0, batch_of([b"more"])))
    (answer,) = produced.responses[0].partition_responses
    assert (answer.error_code, answer.base_offset, answer.log_start_offset) == (0, 10, 4)


def test_a_consumer_from_the_beginning_reads_from_the_new_log_start(
    cluster: RunningIcefloe, confluent: AdminClient, topic: str
) -> None:
    delete(confluent, topic, 0, 7)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        values = []
        while len(values) < 3:
            message = consumer.poll(TIMEOUT)
            assert message is not None
            assert message.error() is None
            values.append((message.offset(), message.value()))
        assert values == [(7, b"v7"), (8, b"v8"), (9, b"v9")]
    finally:
        consumer.close()


def test_minus_one_deletes_up_to_the_high_watermark(confluent: AdminClient, topic: str) -> None:
    assert delete(confluent, topic, 0, -1) == 10
    assert earliest(confluent, topic) == 10


def test_an_offset_past_the_high_watermark_is_offset_out_of_range(
    confluent: AdminClient, topic: str
) -> None:
    assert delete_error(confluent, topic, 0, 11) == KafkaError.OFFSET_OUT_OF_RANGE
    assert earliest(confluent, topic) == 0


def test_a_deletion_before_the_log_start_leaves_it_where_it_is(
    confluent: AdminClient, topic: str
) -> None:
    assert delete(confluent, topic, 0, 6) == 6
    assert delete(confluent, topic, 0, 2) == 6
    assert earliest(confluent, topic) == 6


def test_a_compact_only_topic_refuses_with_policy_violation(
    confluent: AdminClient, topic: str
) -> None:
    assert delete_error(confluent, topic, 0, 5) == KafkaError.POLICY_VIOLATION
    assert earliest(confluent, topic) == 0


def test_kafka_python_delete_records(kafka_python: KafkaAdminClient, topic: str) -> None:
    answer = kafka_python.delete_records({KpTopicPartition(topic, 0): 5})
    assert answer[KpTopicPartition(topic, 0)]["low_watermark"] == 5


def test_unknown_partitions_negative_offsets_and_repeats_get_precise_errors(
    cluster: RunningIcefloe, topic: str
) -> None:
    m = admin_wire.module(21, 2)
    parts = (
        (0, 3),
        (0, 3),  # named twice: answered twice, deleted once
        (1, -2),
        (1, -(1 << 63)),
        (2, 0),
        (-1, 0),
        ((1 << 31) - 1, 0),
    )
    request = m.DeleteRecordsRequest(
        topics=(
            m.DeleteRecordsTopic(
                name=topic,
                partitions=tuple(
                    m.DeleteRecordsPartition(partition_index=i32(p), offset=i64(o))
                    for p, o in parts
                ),
            ),
            m.DeleteRecordsTopic(
                name="no-such-topic",
                partitions=(m.DeleteRecordsPartition(partition_index=i32(0), offset=i64(0)),),
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
    )
    response = admin_wire.call(cluster.bootstrap, request)
    ours, unknown = response.topics
    assert [(int(p.error_code), int(p.low_watermark)) for p in ours.partitions] == [
        (ErrorCode.none, 3),
        (ErrorCode.none, 3),
        (ErrorCode.offset_out_of_range, -1),
        (ErrorCode.offset_out_of_range, -1),
        (ErrorCode.unknown_topic_or_partition, -1),
        (ErrorCode.unknown_topic_or_partition, -1),
        (ErrorCode.unknown_topic_or_partition, -1),
    ]
    assert unknown.partitions[0].error_code == ErrorCode.unknown_topic_or_partition


# --- DescribeProducers -----------------------------------------------------------------------


def test_kafka_python_describe_producers_lists_the_idempotent_producer(
    cluster: RunningIcefloe, kafka_python: KafkaAdminClient, topic: str
) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True})
    for i in range(5):
        producer.produce(topic, value=b"i%d" % i, partition=1)
    assert producer.flush(TIMEOUT) == 0
    states = kafka_python.describe_producers([KpTopicPartition(topic, 1)])
    (active,) = states[KpTopicPartition(topic, 1)].active_producers
    assert active.producer_epoch == 0
    assert active.last_sequence == 4
    assert active.producer_id >= 0
    # The plain producer of partition 0 is not idempotent: nothing to describe.
    assert (
        kafka_python.describe_producers([KpTopicPartition(topic, 0)])[
            KpTopicPartition(topic, 0)
        ].active_producers
        == []
    )


def test_describe_producers_of_an_unknown_partition_is_unknown_topic_or_partition(
    cluster: RunningIcefloe, topic: str
) -> None:
    m = admin_wire.module(61, 0)
    request = m.DescribeProducersRequest(
        topics=(
            m.TopicRequest(name=topic, partition_indexes=(i32(5), i32(-1), i32(0))),
            m.TopicRequest(name="no-such-topic", partition_indexes=(i32(0),)),
        )
    )
    response = admin_wire.call(cluster.bootstrap, request)
    ours, unknown = response.topics
    assert [int(p.error_code) for p in ours.partitions] == [
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.none,
    ]
    assert unknown.partitions[0].error_code == ErrorCode.unknown_topic_or_partition


# --- DescribeLogDirs -------------------------------------------------------------------------


def test_kafka_python_describe_log_dirs_reports_each_partitions_bytes(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    (broker,) = kafka_python.describe_log_dirs({topic: [0, 1, 7]})
    (log_dir,) = broker["log_dirs"]
    assert log_dir["error_code"] == 0
    assert log_dir["log_dir"].startswith("file://")
    (described,) = log_dir["topics"]
    assert described["name"] == topic
    sizes = {p["partition_index"]: p for p in described["partitions"]}
    assert set(sizes) == {0, 1}  # partition 7 does not exist
    assert sizes[0]["partition_size"] > 10 * len(b"v0")
    assert sizes[1]["partition_size"] == 0
    assert all(p["offset_lag"] == 0 and p["is_future_key"] is False for p in sizes.values())


def test_describe_log_dirs_of_every_topic_includes_this_one(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    (broker,) = kafka_python.describe_log_dirs()
    names = {t["name"] for t in broker["log_dirs"][0]["topics"]}
    assert topic in names
