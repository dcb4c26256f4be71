"""Apache Kafka 4.1.1's own command-line tools against `icefloe serve`, run through their Java
classes on the jars `scripts/servers.d/kafka-jars.sh` fetches from Maven Central:
kafka-topics, kafka-configs, kafka-consumer-groups, kafka-delete-records, kafka-log-dirs and
kafka-transactions. Each check reads the tool's own output.

Every run starts a JVM (about a second each), so each test runs one tool's whole workflow on a
topic of its own, against one `icefloe serve` shared by the module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_jvm import (
    CONFIGS,
    CONSUMER_GROUPS,
    DELETE_RECORDS,
    LOG_DIRS,
    TOPICS,
    TRANSACTIONS,
    KafkaTools,
    java_executable,
    rows,
)

TIMEOUT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("kafka-tools") / "data")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tools(cluster: RunningIcefloe) -> KafkaTools:
    java_executable()  # fails naming the fix if Java or the jars are missing
    return KafkaTools(cluster.bootstrap)


@pytest.fixture(scope="module")
def admin(cluster: RunningIcefloe) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def produce(cluster: RunningIcefloe, topic: str, count: int, *, idempotent: bool = False) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": idempotent})
    for i in range(count):
        producer.produce(topic, value=b"v%d" % i, partition=0)
    assert producer.flush(TIMEOUT) == 0


def earliest(admin: AdminClient, topic: str, partition: int = 0) -> int:
    (future,) = admin.list_offsets(
        {TopicPartition(topic, partition): OffsetSpec.earliest()}
    ).values()
    return int(future.result(TIMEOUT).offset)


def test_kafka_topics_creates_lists_describes_alters_and_deletes(tools: KafkaTools) -> None:
    topic = "tool-topics"
    created = tools.run(TOPICS, "--create", "--topic", topic, "--partitions", "2")
    assert created.strip() == f"Created topic {topic}."
    again = tools.run(
        TOPICS, "--create", "--topic", topic, "--partitions", "2", expect_failure=True
    )
    assert "org.apache.kafka.common.errors.TopicExistsException" in again
    assert topic in tools.run(TOPICS, "--list").split()

    tools.run(TOPICS, "--alter", "--topic", topic, "--partitions", "3")
    described = tools.run(TOPICS, "--describe", "--topic", topic)
    header, *partition_lines = described.strip().splitlines()
    assert f"Topic: {topic}" in header
    assert "PartitionCount: 3" in header
    assert "ReplicationFactor: 1" in header
    assert [line.split()[3] for line in partition_lines] == ["0", "1", "2"]  # Partition: N
    assert all("Leader: 1" in line and "Isr: 1" in line for line in partition_lines)

    tools.run(TOPICS, "--delete", "--topic", topic)
    assert topic not in tools.run(TOPICS, "--list").split()


def test_kafka_configs_adds_a_topic_config_and_describes_it(
    tools: KafkaTools, admin: AdminClient
) -> None:
    topic = "tool-configs"
    tools.run(TOPICS, "--create", "--topic", topic, "--partitions", "1")
    base = ("--entity-type", "topics", "--entity-name", topic)
    added = tools.run(
        CONFIGS, *base, "--alter", "--add-config", "retention.ms=3600000,cleanup.policy=delete"
    )
    assert added.strip() == f"Completed updating config for topic {topic}."
    described = tools.run(CONFIGS, *base, "--describe")
    assert described.startswith(f"Dynamic configs for topic {topic} are:")
    assert "retention.ms=3600000 sensitive=false" in described
    assert "DEFAULT_CONFIG:retention.ms=604800000" in described
    assert "cleanup.policy=delete" in described
    deleted = tools.run(CONFIGS, *base, "--alter", "--delete-config", "retention.ms")
    assert deleted.strip() == f"Completed updating config for topic {topic}."
    assert "retention.ms" not in tools.run(CONFIGS, *base, "--describe")


def test_kafka_consumer_groups_lists_describes_resets_and_deletes(
    tools: KafkaTools, cluster: RunningIcefloe
) -> None:
    topic, group = "tool-groups", "tool-group"
    tools.run(TOPICS, "--create", "--topic", topic, "--partitions", "1")
    produce(cluster, topic, 10)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
    finally:
        consumer.close()

    assert group in tools.run(CONSUMER_GROUPS, "--list").split()
    described = rows(tools.run(CONSUMER_GROUPS, "--describe", "--group", group))
    assert described[0][:6] == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
    ]
    assert described[1][:6] == [group, topic, "0", "3", "10", "7"]

    reset = rows(
        tools.run(
            CONSUMER_GROUPS,
            *("--reset-offsets", "--group", group, "--topic", topic),
            *("--to-offset", "8", "--execute"),
        )
    )
    assert reset[1] == [group, topic, "0", "8"]
    described = rows(tools.run(CONSUMER_GROUPS, "--describe", "--group", group))
    assert described[1][:6] == [group, topic, "0", "8", "10", "2"]

    deleted = tools.run(CONSUMER_GROUPS, "--delete-offsets", "--group", group, "--topic", topic)
    assert "Request succeeded for deleting offsets from group" in deleted
    assert [topic, "0", "Successful"] in rows(deleted)

    gone = tools.run(CONSUMER_GROUPS, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in gone
    assert group not in tools.run(CONSUMER_GROUPS, "--list").split()


def test_kafka_delete_records_moves_the_log_start(
    tools: KafkaTools, cluster: RunningIcefloe, admin: AdminClient, tmp_path: Path
) -> None:
    topic = "tool-delete-records"
    tools.run(TOPICS, "--create", "--topic", topic, "--partitions", "1")
    produce(cluster, topic, 10)
    offsets = tmp_path / "offsets.json"
    offsets.write_text(
        json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 6}], "version": 1})
    )
    output = tools.run(DELETE_RECORDS, "--offset-json-file", str(offsets))
    assert f"partition: {topic}-0\tlow_watermark: 6" in output
    assert earliest(admin, topic) == 6

    offsets.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 99}]}))
    output = tools.run(DELETE_RECORDS, "--offset-json-file", str(offsets))
    assert f"partition: {topic}-0\terror: org.apache.kafka.common.errors.OffsetOutOfRange" in output
    assert earliest(admin, topic) == 6


def test_kafka_log_dirs_describes_every_partition_with_its_size(
    tools: KafkaTools, cluster: RunningIcefloe
) -> None:
    topic = "tool-log-dirs"
    tools.run(TOPICS, "--create", "--topic", topic, "--partitions", "2")
    produce(cluster, topic, 10)
    output = tools.run(LOG_DIRS, "--describe", "--topic-list", topic)
    described = json.loads(output.strip().splitlines()[-1])
    (broker,) = described["brokers"]
    (log_dir,) = broker["logDirs"]
    assert log_dir["error"] is None
    assert log_dir["logDir"].startswith("file://")
    partitions = {p["partition"]: p for p in log_dir["partitions"]}
    assert set(partitions) == {f"{topic}-0", f"{topic}-1"}
    assert partitions[f"{topic}-0"]["size"] > 0
    assert partitions[f"{topic}-1"]["size"] == 0
    assert all(p["offsetLag"] == 0 and p["isFuture"] is False for p in partitions.values())


def test_kafka_transactions_describes_an_idempotent_producer(
    tools: KafkaTools, cluster: RunningIcefloe
) -> None:
    topic = "tool-producers"
    tools.run(TOPICS, "--create", "--topic", topic, "--partitions", "1")
    produce(cluster, topic, 4, idempotent=True)
    header, *producers = rows(
        tools.run(TRANSACTIONS, "describe-producers", "--topic", topic, "--partition", "0")
    )
    assert header[:4] == ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence"]
    (producer,) = producers
    assert producer[1:4] == ["0", "-1", "3"]
