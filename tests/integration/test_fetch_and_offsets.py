"""Fetch and offset look-ups end to end: any broker serves, long polls wake, limits hold."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import kafka
import pytest
from confluent_kafka.admin import AdminClient, OffsetSpec
from kio.schema.errors import ErrorCode
from kio.schema.offset_for_leader_epoch.v4.request import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kio.static.primitive import i32

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_clients import Message, consume, produce
from tests.support.kafka_wire import KafkaWire, batch_of, fetch_request, produce_request
from tests.support.topics import create_topic, own_topic_name

TOPIC = "reads"
BASE = 1_700_000_000_000


@dataclasses.dataclass(frozen=True)
class Reads:
    """A broker and a one-partition topic of the test's own."""

    bootstrap: str
    topic: str


@pytest.fixture(scope="module")
def one_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("reads") / "data")
    yield running
    running.stop()


@pytest.fixture
def reads(one_broker: RunningIcefloe, request: pytest.FixtureRequest) -> Reads:
    """The module's broker, with a new topic for each test: its log starts empty."""
    topic = own_topic_name(request, "reads-")
    create_topic(one_broker, topic, 1)
    return Reads(one_broker.bootstrap, topic)


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[RunningIcefloe]:
    """`icefloe serve --brokers 2`, with the test topic."""
    running = start_icefloe(tmp_path / "data", brokers=2)
    create_topic(running, TOPIC, 1)
    yield running
    running.stop()


@pytest.fixture
def two_zones(tmp_path: Path) -> Iterator[tuple[RunningIcefloe, RunningIcefloe]]:
    """Two `icefloe serve` runs on one data directory, in zones z1 and z2."""
    data = tmp_path / "data"
    z1 = start_icefloe(data, env={"ICEFLOE_BROKER__ZONE": "z1"})
    z2 = start_icefloe(data, env={"ICEFLOE_BROKER__ZONE": "z2"})
    create_topic(z1, TOPIC, 4)
    yield z1, z2
    z2.stop()
    z1.stop()


def write(
    address: str, values: list[bytes], *, timestamp: int | None = None, topic: str = TOPIC
) -> Any:
    """Produce one batch through the broker at ``address``; return the partition answer."""
    with KafkaWire(address) as wire:
        response = wire.request(produce_request(topic, 0, batch_of(values, timestamp=timestamp)))
    return response.responses[0].partition_responses[0]


def fetch(address: str, offset: int, topic: str = TOPIC, **kwargs: Any) -> Any:
    with KafkaWire(address) as wire:
        response = wire.request(fetch_request(topic, 0, offset, **kwargs))
    return response.responses[0].partitions[0]


def messages(count: int, partitions: int) -> list[Message]:
    return [
        Message(i % partitions, -1, f"k{i}".encode(), f"v{i}".encode(), (), BASE + i)
        for i in range(count)
    ]


# --- any broker serves any partition --------------------------------------------------------


def test_records_written_through_one_zone_are_read_through_another(
    two_zones: tuple[RunningIcefloe, RunningIcefloe],
) -> None:
    z1, z2 = two_zones
    sent = messages(2_000, 4)
    # A client of a zone sees only that zone's broker, so each client talks to one broker.
    produce("confluent", z1.bootstrap, TOPIC, sent, client_id="writer,zone_id=z1")
    for reader in ("kafka-python", "aiokafka"):
        got = consume(
            reader, z2.bootstrap, TOPIC, dict.fromkeys(range(4), 500), client_id="reader,zone_id=z2"
        )
        assert sorted(m.value or b"" for ms in got.values() for m in ms) == sorted(
            m.value or b"" for m in sent
        )


def test_every_broker_of_a_run_serves_every_partition(two_brokers: RunningIcefloe) -> None:
    answer = write(two_brokers.broker_address(0), [b"a", b"b"])
    assert answer.error_code == ErrorCode.none
    for version in (4, 12):
        data = fetch(two_brokers.broker_address(1), 0, version=version)
        assert data.error_code == ErrorCode.none
        assert data.high_watermark == 2
        assert data.records  # both records, patched to offsets 0 and 1


# --- offsets --------------------------------------------------------------------------------


def test_offsets_for_times_finds_the_first_record_at_or_after(
    reads: Reads,
) -> None:
    for n in range(10):  # ten batches, ten seconds apart
        write(reads.bootstrap, [f"r{n}".encode()], timestamp=BASE + 10_000 * n, topic=reads.topic)
    wanted = [BASE + 35_000, BASE + 40_000, BASE + 1_000_000]

    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": reads.bootstrap, "group.id": "unused"}
    )
    try:
        # One partition per call: librdkafka merges entries for the same partition.
        found = [
            consumer.offsets_for_times(
                [confluent_kafka.TopicPartition(reads.topic, 0, t)], timeout=10
            )
            for t in wanted
        ]
    finally:
        consumer.close()
    assert [tp.offset for [tp] in found] == [4, 4, -1]

    legacy = kafka.KafkaConsumer(bootstrap_servers=reads.bootstrap)
    try:
        partition = kafka.TopicPartition(reads.topic, 0)
        answers = [legacy.offsets_for_times({partition: t})[partition] for t in wanted]
    finally:
        legacy.close()
    assert [(a.offset, a.timestamp) if a else None for a in answers] == [
        (4, BASE + 40_000),
        (4, BASE + 40_000),
        None,
    ]


def test_list_offsets_answers_earliest_latest_and_max_timestamp(
    reads: Reads,
) -> None:
    for n, stamp in enumerate([BASE + 5, BASE + 90, BASE + 20]):
        write(reads.bootstrap, [f"r{n}".encode()], timestamp=stamp, topic=reads.topic)
    admin = AdminClient({"bootstrap.servers": reads.bootstrap})
    partition = confluent_kafka.TopicPartition(reads.topic, 0)

    def offset(spec: OffsetSpec) -> Any:
        return admin.list_offsets({partition: spec})[partition].result(10)

    assert offset(OffsetSpec.earliest()).offset == 0
    assert offset(OffsetSpec.latest()).offset == 3
    newest = offset(OffsetSpec.max_timestamp())
    assert (newest.offset, newest.timestamp) == (1, BASE + 90)


def test_the_single_leader_epoch_ends_at_the_log_end(reads: Reads) -> None:
    write(reads.bootstrap, [b"a", b"b", b"c"], topic=reads.topic)
    request = OffsetForLeaderEpochRequest(
        topics=(
            OffsetForLeaderTopic(
                topic=reads.topic,
                partitions=(
                    OffsetForLeaderPartition(partition=i32(0), leader_epoch=i32(0)),
                    OffsetForLeaderPartition(partition=i32(0), leader_epoch=i32(7)),
                ),
            ),
        )
    )
    with KafkaWire(reads.bootstrap) as wire:
        answers = wire.request(request).topics[0].partitions

    assert [(a.error_code, a.leader_epoch, a.end_offset) for a in answers] == [
        (ErrorCode.none, 0, 3),
        (ErrorCode.none, -1, -1),
    ]


# --- fetch ----------------------------------------------------------------------------------


def test_a_waiting_fetch_returns_as_soon_as_a_record_arrives(
    reads: Reads,
) -> None:
    address = reads.bootstrap
    with KafkaWire(address) as waiting:
        request = fetch_request(reads.topic, 0, 0, max_wait_ms=20_000)
        waiting.send(request)
        time.sleep(0.5)  # the fetch is parked at the log end by now
        assert write(address, [b"late"], topic=reads.topic).error_code == ErrorCode.none
        written = time.monotonic()
        answer = waiting.receive(request).responses[0].partitions[0]
        waited = time.monotonic() - written

    assert answer.high_watermark == 1
    assert answer.records
    assert waited < 10, f"the fetch waited {waited:.1f}s of its 20s after the record came"


def test_a_consumer_at_the_log_end_gets_a_new_record_within_its_wait(
    reads: Reads,
) -> None:
    address = reads.bootstrap
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": address,
            "group.id": "unused",
            "enable.auto.commit": False,  # no group coordinator to commit to
            "fetch.wait.max.ms": 20_000,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(reads.topic, 0, 0)])
        assert consumer.poll(1.0) is None  # a fetch is now waiting on the empty partition
        write(address, [b"late"], topic=reads.topic)
        written = time.monotonic()
        message = consumer.poll(15.0)
        waited = time.monotonic() - written
    finally:
        consumer.close()

    assert message is not None
    assert message.value() == b"late"
    assert waited < 10, f"the record took {waited:.1f}s to arrive (fetch.wait.max.ms is 20s)"


def test_a_fetch_returns_whole_batches_within_its_limits(
    reads: Reads,
) -> None:
    batch_size = len(batch_of([bytes(1000)]))
    for _ in range(3):
        write(reads.bootstrap, [bytes(1000)], topic=reads.topic)

    tiny = fetch(reads.bootstrap, 0, partition_max_bytes=10, topic=reads.topic)
    two = fetch(reads.bootstrap, 0, partition_max_bytes=2 * batch_size + 10, topic=reads.topic)

    assert len(tiny.records) == batch_size  # one whole batch beats no progress
    assert len(two.records) == 2 * batch_size


def test_partitions_read_at_once_keep_the_limits_of_partitions_read_in_turn(
    tmp_path: Path,
) -> None:
    # Partitions whose limits all fit in the request's are read at the same time; the answer
    # must be the one of reading them in request order: only its first data may exceed.
    running = start_icefloe(tmp_path / "data")
    try:
        create_topic(running, "several", 3)
        batch = batch_of([bytes(1000)])
        with KafkaWire(running.bootstrap) as wire:
            for partition in range(3):
                wire.request(produce_request("several", partition, batch))
            order = (2, 0, 1)
            tiny = wire.request(fetch_request("several", order, 0, partition_max_bytes=10))
            roomy = wire.request(
                fetch_request("several", order, 0, partition_max_bytes=len(batch) + 10)
            )
            capped = wire.request(
                fetch_request(
                    "several", order, 0, partition_max_bytes=len(batch), max_bytes=len(batch)
                )
            )
    finally:
        running.stop()

    def sizes(response: Any) -> list[tuple[int, int]]:
        (topic,) = response.responses
        return [(p.partition_index, len(p.records or b"")) for p in topic.partitions]

    assert sizes(tiny) == [(2, len(batch)), (0, 0), (1, 0)]
    assert sizes(roomy) == [(2, len(batch)), (0, len(batch)), (1, len(batch))]
    assert sizes(capped) == [(2, len(batch)), (0, 0), (1, 0)]  # read in turn: no room left


def test_a_fetch_beyond_the_log_end_is_out_of_range(reads: Reads) -> None:
    write(reads.bootstrap, [b"a"], topic=reads.topic)

    at_end = fetch(reads.bootstrap, 1, topic=reads.topic)
    beyond = fetch(reads.bootstrap, 2, topic=reads.topic)

    assert (at_end.error_code, at_end.records) == (ErrorCode.none, b"")
    assert beyond.error_code == ErrorCode.offset_out_of_range


def test_an_incremental_fetch_learns_that_there_are_no_sessions(
    reads: Reads,
) -> None:
    request = fetch_request(reads.topic, 0, 0)
    incremental = dataclasses.replace(request, session_id=i32(12345), session_epoch=i32(3))
    with KafkaWire(reads.bootstrap) as wire:
        full = wire.request(request)
        answer = wire.request(incremental)

    assert (full.error_code, full.session_id) == (ErrorCode.none, 0)
    assert answer.error_code == ErrorCode.fetch_session_id_not_found
    assert answer.responses == ()


def test_fetching_an_unknown_topic_says_so(reads: Reads) -> None:
    with KafkaWire(reads.bootstrap) as wire:
        response = wire.request(fetch_request("no-such-topic", 0, 0))
    data = response.responses[0].partitions[0]
    assert data.error_code == ErrorCode.unknown_topic_or_partition
