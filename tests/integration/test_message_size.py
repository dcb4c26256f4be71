"""Topic `max.message.bytes` as Kafka enforces it, through real producers: a topic may lower the
broker's limit or raise it, up to the cluster's ceiling ([storage] max_topic_batch_bytes)."""

from __future__ import annotations

from collections.abc import Iterator

import kafka.errors
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from tests.support.broker import RunningIcefloe, start_icefloe

TIMEOUT = 30
BIG_CLIENT = {"message.max.bytes": 8 << 20}
"""librdkafka refuses records over 1 MB itself unless told otherwise."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("sizes") / "data")
    yield running
    running.stop()


def create(cluster: RunningIcefloe, name: str, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    (future,) = admin.create_topics([NewTopic(name, 1, 1, config=configs)]).values()
    future.result(timeout=TIMEOUT)


def produce(cluster: RunningIcefloe, topic: str, value: bytes) -> KafkaError | None:
    """The delivery error of one record sent by confluent-kafka, or ``None``."""
    outcome: list[KafkaError | None] = []
    producer = Producer({"bootstrap.servers": cluster.bootstrap, **BIG_CLIENT})
    producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(TIMEOUT)
    assert len(outcome) == 1
    return outcome[0]


def test_a_topic_limit_below_the_broker_s_refuses_larger_batches(cluster: RunningIcefloe) -> None:
    create(cluster, "small", **{"max.message.bytes": "51200"})
    error = produce(cluster, "small", b"x" * (200 << 10))
    assert error is not None
    assert error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert produce(cluster, "small", b"x" * 1000) is None


def test_kafka_python_gets_message_too_large_from_a_topic_limit(cluster: RunningIcefloe) -> None:
    create(cluster, "small-kp", **{"max.message.bytes": "51200"})
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, max_request_size=8 << 20)
    try:
        with pytest.raises(kafka.errors.MessageSizeTooLargeError):
            producer.send("small-kp", b"x" * (200 << 10)).get(timeout=TIMEOUT)
    finally:
        producer.close()


def test_a_topic_may_raise_the_limit_and_its_large_records_read_back_whole(
    cluster: RunningIcefloe,
) -> None:
    value = bytes(range(256)) * (8 << 10)  # 2 MiB, over the broker's 1 MiB default
    create(cluster, "default-limit")
    error = produce(cluster, "default-limit", value)
    assert error is not None
    assert error.code() == KafkaError.MSG_SIZE_TOO_LARGE

    create(cluster, "large", **{"max.message.bytes": str(10 << 20)})
    assert produce(cluster, "large", value) is None
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "large-reader",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        consumer.subscribe(["large"])
        message = None
        for _ in range(TIMEOUT):
            message = consumer.poll(1)
            if message is not None:
                break
        assert message is not None
        assert message.error() is None
        assert message.value() == value
    finally:
        consumer.close()


def test_a_limit_over_the_cluster_ceiling_is_invalid_config(cluster: RunningIcefloe) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    wanted = NewTopic("huge", 1, 1, config={"max.message.bytes": str(32 << 20)})
    (future,) = admin.create_topics([wanted]).values()
    with pytest.raises(KafkaException) as caught:
        future.result(timeout=TIMEOUT)
    error: KafkaError = caught.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "max_topic_batch_bytes" in error.str()
