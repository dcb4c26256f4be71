"""Reads that once froze or silently stalled a broker.

- A consumer with a large ``fetch.min.bytes`` reading a compacted (Parquet) partition: the
  broker answers it at once with what there is (the partition has more than its limit let in)
  instead of re-reading until ``fetch.wait.max.ms``, and a second client stays served.
- A stored object lost from under the index: the consumer gets KAFKA_STORAGE_ERROR (retriable)
  and the log one error naming the object and the stream; later records stay readable.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from icefloe.embedded import local_wal
from icefloe.storage.batch import read_header
from icefloe.storage.index import ParquetLocation
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_wire import KafkaWire, batch_of, fetch_request, produce_request
from tests.support.topics import create_topic, log_end, with_storage

TOPIC = "cold"
RECORDS = 4_000
VALUE_BYTES = 2_000  # 8 MB in all: several times the consumer's 1 MiB partition limit
FAST_COMPACTION = {
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
}


class Bystander(threading.Thread):
    """Asks for API versions every 50 ms on its own connection and keeps the slowest wait."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self._address = address
        self._done = threading.Event()
        self.slowest = 0.0
        self.answers = 0

    def run(self) -> None:
        request = ApiVersionsRequest(client_software_name="b", client_software_version="1")
        with KafkaWire(self._address) as wire:
            while not self._done.wait(0.05):
                started = time.monotonic()
                wire.request(request)
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.answers += 1

    def finish(self) -> None:
        self._done.set()
        self.join(30)


def compacted(running: RunningIcefloe) -> bool:
    async def check(topics: Any, storage: Any) -> bool:
        stream = (await topics.get(TOPIC)).streams[0]
        entries = await storage.index.scan(stream)
        return bool(entries) and all(isinstance(e.location, ParquetLocation) for e in entries)

    return with_storage(running, check)


@pytest.fixture(scope="module")
def compacted_topic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("cold") / "data", env=FAST_COMPACTION)
    create_topic(running, TOPIC, 1)
    producer = confluent_kafka.Producer({"bootstrap.servers": running.bootstrap, "linger.ms": 5})
    for _ in range(RECORDS):
        producer.produce(TOPIC, value=os.urandom(VALUE_BYTES), partition=0)
    assert producer.flush(60) == 0
    deadline = time.monotonic() + 120
    while not compacted(running):
        assert time.monotonic() < deadline, "compaction did not catch up"
        time.sleep(0.5)
    yield running
    running.stop()


def test_a_consumer_with_a_large_fetch_min_bytes_is_served_and_so_is_everyone_else(
    compacted_topic: RunningIcefloe,
) -> None:
    bystander = Bystander(compacted_topic.bootstrap)
    bystander.start()
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": compacted_topic.bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "fetch.min.bytes": 10_000_000,
            "fetch.wait.max.ms": 5_000,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, 0)])
        received = 0
        deadline = time.monotonic() + 120
        while received < RECORDS:
            assert time.monotonic() < deadline, f"only {received} records arrived"
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                received += 1
    finally:
        consumer.close()
        bystander.finish()

    assert bystander.answers > 0
    assert bystander.slowest < 1.0, f"the bystander waited {bystander.slowest:.2f} s"


def test_a_fetch_capped_by_its_partition_limit_is_answered_before_its_wait(
    compacted_topic: RunningIcefloe,
) -> None:
    request = fetch_request(
        TOPIC, 0, 0, min_bytes=10_000_000, max_wait_ms=20_000, partition_max_bytes=64 << 10
    )
    with KafkaWire(compacted_topic.bootstrap) as wire:
        started = time.monotonic()
        answer = wire.request(request).responses[0].partitions[0]
        waited = time.monotonic() - started

    assert answer.error_code == ErrorCode.none
    # Whole batches within the limit, or the single first batch when it alone exceeds it.
    first = read_header(answer.records)
    assert len(answer.records) <= 64 << 10 or len(answer.records) == first.size
    # Waiting could not add bytes to this partition; the full 20 s wait would mean it spun.
    assert waited < 10, f"answered after {waited:.1f} s of a 20 s wait"


def wal_segment_files(data_dir: Path) -> list[Path]:
    """The local WAL's segment files (the embedded default's WAL)."""
    return sorted((data_dir / "wal").glob(f"*{local_wal.SUFFIX}"))


def test_a_lost_wal_object_is_a_storage_error_and_later_records_stay_readable(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    create_topic(running, "lost", 1)
    with KafkaWire(running.bootstrap) as wire:
        wire.request(produce_request("lost", 0, batch_of([b"gone-1", b"gone-2"])))
    running.stop()
    (lost,) = wal_segment_files(data)  # holding the one WAL object written
    lost.unlink()

    # Restarted, the broker holds no copy in memory; a record written now lives elsewhere.
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    try:
        with KafkaWire(running.bootstrap) as wire:
            wire.request(produce_request("lost", 0, batch_of([b"kept"])))
            lost_answer = wire.request(fetch_request("lost", 0, 0)).responses[0].partitions[0]
            again = wire.request(fetch_request("lost", 0, 1)).responses[0].partitions[0]
            kept = wire.request(fetch_request("lost", 0, 2)).responses[0].partitions[0]
        assert log_end(running, "lost", 0) == 3
    finally:
        running.stop()

    assert lost_answer.error_code == ErrorCode.kafka_storage_error
    assert again.error_code == ErrorCode.kafka_storage_error
    assert kept.error_code == ErrorCode.none
    assert b"kept" in kept.records
    errors = [line for line in running.log_path.read_text().splitlines() if lost.stem in line]
    assert len(errors) == 1, errors  # one line, not one per retry
    assert "offsets [0, 2)" in errors[0]
    assert "Traceback" not in running.log_path.read_text()
