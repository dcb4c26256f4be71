"""Log compaction through real clients against `icefloe serve`: a compacted topic refuses
records without a key (as Kafka 4 does), and after compaction consumers see Kafka's semantics
(the last value of each key, tombstones for delete.retention.ms, then gone; offsets and the
log end unchanged; positions that move past records removed from the end), while DuckDB's
current-state query of both tables agrees."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import InvalidRecordError
from kio.schema.errors import ErrorCode

from tests.integration.test_compaction_clients import tables
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_wire import KafkaWire, batch_of, produce_request
from tests.support.table_readers import duckdb_connection

TOPIC = "state"
KEYS = 10
ROUNDS = 3
DELETED = (b"k8", b"k9")
RETENTION_MS = 20_000
"""delete.retention.ms of the topic: the tombstones outlive the first cleaning, then go. They
go by their timestamps, so this must outlast compaction into Parquet, the first cleaning and a
read on a busy machine (8 s did not, once)."""

CURRENT_STATE = """
    SELECT key, value FROM {relation}
    QUALIFY row_number() OVER (PARTITION BY "partition", key ORDER BY "offset" DESC) = 1
        AND value IS NOT NULL
    ORDER BY key
"""

Row = tuple[int, bytes | None, bytes | None]


@pytest.fixture
def running(tmp_path: Path) -> Any:
    icefloe = start_icefloe(
        tmp_path / "data",
        env={
            "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
            "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
            "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
        },
    )
    try:
        yield icefloe
    finally:
        assert icefloe.stop() == 0


def produce(bootstrap: str) -> list[Row]:
    """ROUNDS updates of every key, then tombstones for DELETED: (offset, key, value) of each."""
    config = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"}
    config["delete.retention.ms"] = str(RETENTION_MS)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1, config=config)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    written: list[Row] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        written.append((message.offset(), message.key(), message.value()))

    for round_ in range(ROUNDS):
        for k in range(KEYS):
            producer.produce(TOPIC, key=b"k%d" % k, value=b"v%d" % round_, on_delivery=delivered)
        producer.flush(30)  # each round a request (and a WAL entry, and a data file) of its own
    for key in DELETED:
        producer.produce(TOPIC, key=key, value=None, on_delivery=delivered)
    producer.flush(30)
    return sorted(written, key=lambda row: row[0])


def latest(written: list[Row], *, tombstones: bool) -> list[Row]:
    last = {key: (offset, key, value) for offset, key, value in written}
    return sorted(row for row in last.values() if tombstones or row[2] is not None)


def read_with_kafka_python(bootstrap: str) -> tuple[list[Row], int]:
    """Every record from the beginning, and the end offset; the consumer's position must
    reach the end offset (past records removed from the end of the log)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(TOPIC, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    seen: list[Row] = []
    deadline = time.monotonic() + 30
    while consumer.position(tp) < end:
        assert time.monotonic() < deadline, f"stuck at {consumer.position(tp)} of {end}"
        for records in consumer.poll(timeout_ms=300).values():
            seen.extend((r.offset, r.key, r.value) for r in records)
    consumer.close()
    return seen, end


def read_with_librdkafka(bootstrap: str) -> list[Row]:
    """Every record until librdkafka reports the end of the partition (its fetch position
    reached the high watermark)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.subscribe([TOPIC])
    seen: list[Row] = []
    deadline = time.monotonic() + 30
    try:
        while True:
            assert time.monotonic() < deadline, f"no end of partition after {seen}"
            message = consumer.poll(0.3)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return seen
            seen.append((message.offset(), message.key(), message.value()))
    finally:
        consumer.close()


def wait_for(running: RunningIcefloe, expected: list[Row]) -> None:
    deadline = time.monotonic() + 60
    while (seen := read_with_kafka_python(running.bootstrap)[0]) != expected:
        assert time.monotonic() < deadline, f"log compaction never got to {expected}: {seen}"
        time.sleep(0.5)


def current_state(running: RunningIcefloe) -> dict[str, list[tuple[bytes, bytes]]]:
    duckdb = duckdb_connection()
    rows = {row["format"]: row for row in tables(running) if row["topic"] == TOPIC}
    relations = {
        "iceberg": f"iceberg_scan('{rows['iceberg']['metadata_location']}')",
        "delta": f"delta_scan('{rows['delta']['location']}')",
    }
    state = {}
    for name, relation in relations.items():
        result = pa.table(duckdb.execute(CURRENT_STATE.format(relation=relation)).arrow())
        state[name] = list(zip(result["key"].to_pylist(), result["value"].to_pylist(), strict=True))
    return state


def test_a_compacted_topic_refuses_records_without_a_key(running: RunningIcefloe) -> None:
    config = {"cleanup.policy": "compact"}
    admin = AdminClient({"bootstrap.servers": running.bootstrap})
    admin.create_topics([NewTopic("keyed", 1, 1, config=config)])["keyed"].result(30)
    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": running.bootstrap, "retries": 0})
    producer.produce("keyed", value=b"no key", on_delivery=lambda e, _m: errors.append(e))
    producer.flush(30)
    assert [e.code() for e in errors] == [KafkaError.INVALID_RECORD]

    by_kafka_python = KafkaProducer(bootstrap_servers=running.bootstrap, retries=0)
    with pytest.raises(InvalidRecordError):
        by_kafka_python.send("keyed", value=b"no key").get(timeout=30)
    assert by_kafka_python.send("keyed", key=b"k", value=b"keyed").get(timeout=30).offset == 0
    by_kafka_python.close()

    # On the wire: Kafka's record errors and message from v8 on, the same code before.
    record_error = "Compacted topic cannot accept message without key in topic partition keyed-0"
    with KafkaWire(running.bootstrap) as wire:
        for version in (3, 9):
            request = produce_request("keyed", 0, batch_of([b"a", b"b"]), version=version)
            answer = wire.request(request).responses[0].partition_responses[0]
            assert (answer.error_code, answer.base_offset) == (ErrorCode.invalid_record, -1)
            if version >= 8:
                assert [
                    (e.batch_index, e.batch_index_error_message) for e in answer.record_errors
                ] == [
                    (0, record_error),
                    (1, record_error),
                ]
                assert answer.error_message.startswith(
                    "One or more records have been rejected due to 2 record errors in total"
                )


def test_consumers_see_kafkas_log_compaction_and_the_tables_the_current_state(
    running: RunningIcefloe,
) -> None:
    written = produce(running.bootstrap)
    log_end = len(written)
    assert [offset for offset, _, _ in written] == list(range(log_end))

    # Cleaned: the last record of each key, tombstones included, at their own offsets.
    with_tombstones = latest(written, tombstones=True)
    wait_for(running, with_tombstones)
    assert read_with_librdkafka(running.bootstrap) == with_tombstones
    expected_state = [(key, value) for _, key, value in latest(written, tombstones=False)]
    assert current_state(running) == {"iceberg": expected_state, "delta": expected_state}

    # delete.retention.ms later the tombstones (the last records of the log) are gone too;
    # the log end stays, and both consumers' positions move past the removed tail.
    without = latest(written, tombstones=False)
    wait_for(running, without)
    seen, end = read_with_kafka_python(running.bootstrap)
    assert (seen, end) == (without, log_end)
    assert read_with_librdkafka(running.bootstrap) == without
    assert current_state(running) == {"iceberg": expected_state, "delta": expected_state}
