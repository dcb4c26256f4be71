"""Invariant 4 (docs/design.md) with real clients: what a Kafka consumer reads is the same before
and after the topic is compacted into Parquet, for every compression codec, and for a topic
whose tables are partitioned by hour (its producer batches straddle hours, so compaction cuts
them in two). And a topic deleted and created again gets new tables."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import DeltaTable
from kafka import KafkaConsumer, TopicPartition

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.tables_cli import tables_json

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
PER_CODEC = 400


def produce(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    for codec in CODECS:
        producer = Producer(
            {"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20}
        )
        for i in range(PER_CODEC):
            producer.produce(
                topic,
                key=f"{codec}-{i % 13}".encode(),
                value=f"{codec} record {i} ".encode() * (1 + i % 5),
                headers=[("codec", codec.encode()), ("i", str(i).encode()), ("i", None)],
                partition=i % PARTITIONS,
                timestamp=1_700_000_000_000 + i,
            )
        producer.flush(30)


def consume_all(bootstrap: str, topic: str) -> list[tuple[object, ...]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    ends = consumer.end_offsets(partitions)
    seen: list[tuple[object, ...]] = []
    deadline = time.monotonic() + 60
    while any(consumer.position(tp) < ends[tp] for tp in partitions):
        assert time.monotonic() < deadline, "consumer did not reach the end"
        for tp, records in consumer.poll(timeout_ms=500).items():
            seen.extend(
                (tp.partition, r.offset, r.timestamp, r.key, r.value, tuple(r.headers))
                for r in records
            )
    consumer.close()
    return sorted(seen, key=lambda row: (row[0], row[1]))


def tables(running: RunningIcefloe) -> list[dict[str, object]]:
    return tables_json(running.data_dir)


def produce_across_hours(bootstrap: str, topic: str) -> None:
    """Records 7 s apart in time, batched by the producer, so batches straddle hours."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"icefloe.table.partition.time": "hour"}
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
    for i in range(3 * PER_CODEC):
        producer.produce(
            topic,
            value=b"%d" % i,
            partition=i % PARTITIONS,
            timestamp=1_700_000_000_000 + 7_000 * i,
        )
    producer.flush(30)


def consume_with_librdkafka(bootstrap: str, topic: str, expected: int) -> list[tuple[object, ...]]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[tuple[object, ...]] = []
    deadline = time.monotonic() + 60
    while len(seen) < expected:
        assert time.monotonic() < deadline, f"read {len(seen)} of {expected} records"
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append((message.partition(), message.offset(), message.value()))
    consumer.close()
    return sorted(seen, key=lambda row: (row[0], row[1]))


def compacted(data: Path) -> RunningIcefloe:
    """A broker on ``data`` that compacts everything at once; returns once nothing waits."""
    running = start_icefloe(
        data,
        env={
            "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
            "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
            "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
        },
    )
    deadline = time.monotonic() + 120
    while not all(row["lag_records"] == 0 for row in tables(running)):
        assert time.monotonic() < deadline, "compaction did not catch up"
        time.sleep(0.5)
    return running


def test_consumers_read_the_same_records_before_and_after_compaction(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    try:
        produce(running.bootstrap, "events")
        before = consume_all(running.bootstrap, "events")
        assert len(before) == len(CODECS) * PER_CODEC
    finally:
        assert running.stop() == 0

    running = compacted(data)  # the same data, now with compaction on
    try:
        after = consume_all(running.bootstrap, "events")
    finally:
        assert running.stop() == 0
    assert after == before


def test_batches_cut_at_an_hour_read_the_same_after_compaction(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    try:
        produce_across_hours(running.bootstrap, "hourly")
        before = consume_all(running.bootstrap, "hourly")
        assert len(before) == 3 * PER_CODEC
    finally:
        assert running.stop() == 0

    running = compacted(data)
    try:
        files = {row["format"]: row["files"] for row in tables(running)}
        assert files["iceberg"] == files["delta"] >= PARTITIONS * 3  # 2.3 hours of records
        assert consume_all(running.bootstrap, "hourly") == before
        by_librdkafka = consume_with_librdkafka(running.bootstrap, "hourly", len(before))
    finally:
        assert running.stop() == 0
    assert by_librdkafka == [(p, o, v) for p, o, _, _, v, _ in before]


def test_a_topic_deleted_and_created_again_starts_with_new_tables(tmp_path: Path) -> None:
    running = compacted(tmp_path / "data")
    admin = AdminClient({"bootstrap.servers": running.bootstrap})
    try:
        for generation, count in (("old", 50), ("new", 5)):
            admin.create_topics([NewTopic("cycle", 1, 1)])["cycle"].result(30)
            producer = Producer({"bootstrap.servers": running.bootstrap})
            for i in range(count):
                producer.produce("cycle", value=f"{generation} {i}".encode())
            producer.flush(30)
            rows = wait_for_tables(running, "cycle", count)
            if generation == "old":
                admin.delete_topics(["cycle"])["cycle"].result(30)
        delta = next(row for row in rows if row["format"] == "delta")
        values = DeltaTable(str(delta["location"])).to_pyarrow_table().column("value")
        assert sorted(values.to_pylist()) == [f"new {i}".encode() for i in range(5)]
        files = {row["format"]: row["files"] for row in rows}
        assert files["iceberg"] == files["delta"] == len(delta_files(delta))
    finally:
        assert running.stop() == 0


def delta_files(row: dict[str, object]) -> list[str]:
    return list(DeltaTable(str(row["location"])).file_uris())


def wait_for_tables(running: RunningIcefloe, topic: str, records: int) -> list[dict[str, object]]:
    """The topic's table rows of `icefloe tables` once ``records`` are in both tables."""
    deadline = time.monotonic() + 60
    while True:
        rows = [row for row in tables(running) if row["topic"] == topic]
        if len(rows) == 2 and all(row["lag_records"] == 0 and row["commit"] for row in rows):
            return rows
        assert time.monotonic() < deadline, f"the tables never caught up: {rows}"
        time.sleep(0.5)
