"""What a Produce request is answered: acks, unknown partitions, strict ownership."""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_wire import KafkaWire, batch_of, fetch_request, produce_request
from tests.support.topics import create_topic, log_end, own_topic_name, with_storage

TOPIC = "answers"


@pytest.fixture(scope="module")
def icefloe_with_topic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    """One broker for the module, with a one-partition topic that nothing is written to."""
    running = start_icefloe(tmp_path_factory.mktemp("answers") / "data")
    create_topic(running, TOPIC, 1)
    yield running
    running.stop()


@dataclasses.dataclass(frozen=True)
class Fresh:
    """The module's broker and a one-partition topic of the test's own."""

    icefloe: RunningIcefloe
    topic: str


@pytest.fixture
def fresh(icefloe_with_topic: RunningIcefloe, request: pytest.FixtureRequest) -> Fresh:
    topic = own_topic_name(request, f"{TOPIC}-")
    create_topic(icefloe_with_topic, topic, 1)
    return Fresh(icefloe_with_topic, topic)


@pytest.fixture
def strict_brokers(tmp_path: Path) -> Iterator[RunningIcefloe]:
    running = start_icefloe(
        tmp_path / "data", brokers=2, env={"ICEFLOE_BROKER__STRICT_OWNERSHIP": "true"}
    )
    create_topic(running, TOPIC, 1)
    yield running
    running.stop()


def answer_of(response: Any) -> Any:
    return response.responses[0].partition_responses[0]


def test_acks_0_is_written_and_not_answered(fresh: Fresh) -> None:
    with KafkaWire(fresh.icefloe.bootstrap) as wire:
        wire.send(produce_request(fresh.topic, 0, batch_of([b"quiet"]), acks=0))
        # The next answer on this connection is the fetch's: the produce got none.
        fetched = wire.request(fetch_request(fresh.topic, 0, 0, max_wait_ms=5_000))

    assert fetched.responses[0].partitions[0].high_watermark == 1


def test_acks_1_is_durable_like_acks_all(fresh: Fresh) -> None:
    with KafkaWire(fresh.icefloe.bootstrap) as wire:
        answer = answer_of(wire.request(produce_request(fresh.topic, 0, batch_of([b"x"]), acks=1)))

    assert (answer.error_code, answer.base_offset) == (ErrorCode.none, 0)
    assert log_end(fresh.icefloe, fresh.topic, 0) == 1  # committed before the answer


def test_acks_other_than_minus_1_0_1_are_refused(fresh: Fresh) -> None:
    with KafkaWire(fresh.icefloe.bootstrap) as wire:
        answer = answer_of(wire.request(produce_request(fresh.topic, 0, batch_of([b"x"]), acks=2)))

    assert answer.error_code == ErrorCode.invalid_required_acks
    assert log_end(fresh.icefloe, fresh.topic, 0) == 0


@pytest.mark.parametrize(("topic", "partition"), [("no-such-topic", 0), (TOPIC, 1)])
def test_an_unknown_partition_is_refused(
    icefloe_with_topic: RunningIcefloe, topic: str, partition: int
) -> None:
    with KafkaWire(icefloe_with_topic.bootstrap) as wire:
        answer = answer_of(wire.request(produce_request(topic, partition, batch_of([b"x"]))))

    assert answer.error_code == ErrorCode.unknown_topic_or_partition


def test_strict_ownership_sends_clients_to_the_owner(strict_brokers: RunningIcefloe) -> None:
    owner = AdminClient({"bootstrap.servers": strict_brokers.bootstrap}).list_topics(
        TOPIC, timeout=10
    )
    leader = owner.topics[TOPIC].partitions[0].leader
    owner_port = owner.brokers[leader].port
    other_port = next(b.port for b in owner.brokers.values() if b.id != leader)
    answers = {}
    for port in (other_port, owner_port):
        with KafkaWire(f"{strict_brokers.host}:{port}") as wire:
            answers[port] = answer_of(wire.request(produce_request(TOPIC, 0, batch_of([b"x"]))))

    assert answers[other_port].error_code == ErrorCode.not_leader_or_follower
    assert answers[owner_port].error_code == ErrorCode.none
    assert log_end(strict_brokers, TOPIC, 0) == 1


def test_two_brokers_agree_on_the_owners_of_a_topics_partitions_and_own_half_each(
    strict_brokers: RunningIcefloe,
) -> None:
    """Partitions spread evenly: by rendezvous hashing alone this topic went 7 to 1."""
    create_topic(strict_brokers, "sidebyside", 8)
    seen = AdminClient({"bootstrap.servers": strict_brokers.bootstrap}).list_topics(timeout=10)
    leaders_by_broker = []
    for broker in seen.brokers.values():
        answer = AdminClient({"bootstrap.servers": f"{broker.host}:{broker.port}"}).list_topics(
            "sidebyside", timeout=10
        )
        partitions = answer.topics["sidebyside"].partitions
        leaders_by_broker.append([partitions[p].leader for p in range(8)])

    assert len(leaders_by_broker) == 2
    assert leaders_by_broker[0] == leaders_by_broker[1]
    assert sorted(Counter(leaders_by_broker[0]).values()) == [4, 4]


def test_produce_answers_report_the_log_start(fresh: Fresh) -> None:
    def produce(value: bytes) -> Any:
        with KafkaWire(fresh.icefloe.bootstrap) as wire:
            return answer_of(
                wire.request(produce_request(fresh.topic, 0, batch_of([value, value])))
            )

    assert produce(b"first").log_start_offset == 0
    assert produce(b"second").log_start_offset == 0

    async def expire_the_first_entry(topics: Any, storage: Any) -> None:
        stream = (await topics.get(fresh.topic)).streams[0]
        first = await storage.index.first_entry(stream)
        assert await storage.offset_index.expire(stream, [first]) == 1

    with_storage(fresh.icefloe, expire_the_first_entry)  # as retention on any broker would
    deadline = time.monotonic() + 10
    while (start := produce(b"later").log_start_offset) != 2:
        assert time.monotonic() < deadline, f"the log start stayed {start}"
        time.sleep(0.1)
