"""Topic configs that have the broker rewrite batches, through real clients:
`message.timestamp.type=LogAppendTime` stamps each batch with the broker's time (in the produce
answer and for every consumer), CreateTime keeps the producer's timestamps, and
`compression.type` stores batches recompressed, idempotent producers' included."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from tests.support.broker import RunningIcefloe, start_icefloe

TIMEOUT = 30
PRODUCER_TIME = 1_600_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("timestamps") / "data")
    yield running
    running.stop()


def produce(cluster: RunningIcefloe, topic: str, timestamp_type: str) -> list[tuple[int, int]]:
    """Create ``topic`` and send 3 records stamped PRODUCER_TIME; the (type, timestamp) of
    each delivery report."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {"message.timestamp.type": timestamp_type}
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(TIMEOUT)
    reports: list[tuple[int, int]] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 50})
    for i in range(3):
        producer.produce(
            topic,
            f"r{i}".encode(),
            timestamp=PRODUCER_TIME + i,
            on_delivery=lambda err, msg: reports.append(msg.timestamp() if err is None else err),
        )
    producer.flush(TIMEOUT)
    return reports


def consume(cluster: RunningIcefloe, topic: str) -> list[tuple[int, int]]:
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": topic, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([topic])
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + TIMEOUT
    while len(seen) < 3 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            seen.append(message.timestamp())
    consumer.close()
    return seen


def test_a_log_append_time_topic_stamps_batches_with_the_broker_s_time(
    cluster: RunningIcefloe,
) -> None:
    before = int(time.time() * 1000)
    reports = produce(cluster, "appended", "LogAppendTime")
    after = int(time.time() * 1000)

    assert len(reports) == 3
    assert {kind for kind, _ in reports} == {TIMESTAMP_LOG_APPEND_TIME}
    assert all(before <= stamp <= after for _, stamp in reports)
    assert sorted(consume(cluster, "appended")) == sorted(reports)

    by_kafka_python = KafkaConsumer(bootstrap_servers=cluster.bootstrap, consumer_timeout_ms=5000)
    partition = TopicPartition("appended", 0)
    by_kafka_python.assign([partition])
    by_kafka_python.seek_to_beginning(partition)
    records = [
        record for _, records in by_kafka_python.poll(timeout_ms=5000).items() for record in records
    ]
    by_kafka_python.close()
    assert [(r.timestamp_type, r.timestamp) for r in records] == [(1, s) for _, s in reports]


def test_a_create_time_topic_keeps_the_producer_s_timestamps(cluster: RunningIcefloe) -> None:
    reports = produce(cluster, "created", "CreateTime")
    expected = [(TIMESTAMP_CREATE_TIME, PRODUCER_TIME + i) for i in range(3)]
    assert sorted(reports) == expected
    assert sorted(consume(cluster, "created")) == expected


@pytest.mark.parametrize("codec", ["zstd", "uncompressed"])
def test_a_topic_codec_stores_what_an_idempotent_producer_sends_recompressed(
    cluster: RunningIcefloe, codec: str
) -> None:
    topic = f"recompressed-{codec}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {"compression.type": codec}
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(TIMEOUT)
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "enable.idempotence": True,
            "compression.type": "gzip",
            "linger.ms": 20,
        }
    )
    errors: list[object] = []
    for i in range(200):
        producer.produce(
            topic,
            f"value {i}".encode() * 4,
            key=b"k%d" % (i % 7),
            on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
        )
        producer.poll(0)
    assert producer.flush(TIMEOUT) == 0
    assert errors == []

    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, consumer_timeout_ms=5000)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    values = [record.value for record in consumer]
    consumer.close()
    assert values == [f"value {i}".encode() * 4 for i in range(200)]
