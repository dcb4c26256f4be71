"""Idempotent producers: a retried batch is stored once, on whichever broker receives it.

The client tests show real idempotent producers work end to end; the raw tests force what a
client only does by accident (a retry of the very same batch, after the first attempt was
written, through another broker) and check what is stored behind the brokers.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.static.primitive import i16, i64

from icefloe.storage.records import Record, build_batch
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_clients import CLIENTS, Message, consume, produce
from tests.support.kafka_wire import KafkaWire, batch_of, produce_request
from tests.support.topics import create_topic, log_end, own_topic_name, stored_records

TOPIC = "idempotent"


@pytest.fixture(scope="module")
def two_brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("idempotent") / "data", brokers=2)
    yield running
    running.stop()


@pytest.fixture
def topic(two_brokers: RunningIcefloe, request: pytest.FixtureRequest) -> str:
    """A one-partition topic of the test's own: its log starts empty."""
    name = own_topic_name(request, f"{TOPIC}-")
    create_topic(two_brokers, name, 1)
    return name


def init_producer_id(wire: KafkaWire, transactional_id: str | None = None) -> Any:
    return wire.request(
        InitProducerIdRequest(
            transactional_id=transactional_id,
            transaction_timeout=datetime.timedelta(seconds=60),
            producer_id=i64(-1),
            producer_epoch=i16(-1),
        )
    )


def produce_answer(wire: KafkaWire, topic: str, records: bytes, **kwargs: Any) -> Any:
    """The one partition answer of a Produce request for partition 0 of ``topic``."""
    response = wire.request(produce_request(topic, 0, records, **kwargs))
    return response.responses[0].partition_responses[0]


@pytest.mark.parametrize("client", CLIENTS)
def test_an_idempotent_client_writes_every_record_once(
    two_brokers: RunningIcefloe, topic: str, client: str
) -> None:
    messages = [
        Message(0, -1, f"k{i}".encode(), f"v{i}".encode(), (), 1_700_000_000_000 + i)
        for i in range(5_000)
    ]
    produce(client, two_brokers.bootstrap, topic, messages, idempotent=True)
    got = consume("confluent", two_brokers.bootstrap, topic, {0: len(messages)})[0]
    assert [(m.offset, m.key, m.value) for m in got] == [
        (i, m.key, m.value) for i, m in enumerate(messages)
    ]
    assert log_end(two_brokers, topic, 0) == len(messages)


def test_a_retried_batch_through_another_broker_is_stored_once(
    two_brokers: RunningIcefloe,
    topic: str,
) -> None:
    with (
        KafkaWire(two_brokers.broker_address(0)) as first,
        KafkaWire(two_brokers.broker_address(1)) as second,
    ):
        producer = init_producer_id(first)
        pid, epoch = producer.producer_id, producer.producer_epoch
        batch = batch_of([b"a", b"b", b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        original = produce_answer(first, topic, batch)
        retried = produce_answer(second, topic, batch)
        following = batch_of([b"d"], producer_id=pid, producer_epoch=epoch, base_sequence=3)
        next_batch = produce_answer(second, topic, following)

    assert (original.error_code, original.base_offset) == (ErrorCode.none, 0)
    assert (retried.error_code, retried.base_offset) == (ErrorCode.none, 0)
    assert (next_batch.error_code, next_batch.base_offset) == (ErrorCode.none, 3)
    assert [r.value for r in stored_records(two_brokers, topic, 0)] == [b"a", b"b", b"c", b"d"]


def test_a_sequence_gap_is_refused_as_retriable_and_not_stored(
    two_brokers: RunningIcefloe, topic: str
) -> None:
    """A batch ahead of its producer's next sequence may follow batches still on their way
    (through another broker, or to be retried here): clients retry NOT_ENOUGH_REPLICAS as it
    is, where OUT_OF_ORDER_SEQUENCE_NUMBER makes librdkafka renumber every batch it has not had
    acknowledged under a new epoch — and write again one that was written under the old."""
    with KafkaWire(two_brokers.bootstrap) as wire:
        producer = init_producer_id(wire)
        ids = {"producer_id": producer.producer_id, "producer_epoch": producer.producer_epoch}
        first = produce_answer(wire, topic, batch_of([b"a"], base_sequence=0, **ids))
        assert first.error_code == ErrorCode.none
        gap = produce_answer(wire, topic, batch_of([b"f"], base_sequence=5, **ids))
        assert [r.value for r in stored_records(two_brokers, topic, 0)] == [b"a"]
        between = produce_answer(
            wire, topic, batch_of([b"b", b"c", b"d", b"e"], base_sequence=1, **ids)
        )
        retried = produce_answer(wire, topic, batch_of([b"f"], base_sequence=5, **ids))
        rewound = produce_answer(wire, topic, batch_of([b"x"], base_sequence=3, **ids))

    assert gap.error_code == ErrorCode.not_enough_replicas
    assert "sequence 5 follows sequence 0" in gap.error_message
    assert (between.error_code, between.base_offset) == (ErrorCode.none, 1)
    assert (retried.error_code, retried.base_offset) == (ErrorCode.none, 5)
    assert rewound.error_code == ErrorCode.out_of_order_sequence_number
    assert [r.value for r in stored_records(two_brokers, topic, 0)] == [
        b"a",
        b"b",
        b"c",
        b"d",
        b"e",
        b"f",
    ]


def test_pipelined_batches_of_one_connection_keep_their_order(
    two_brokers: RunningIcefloe,
    topic: str,
) -> None:
    """What an idempotent client with five requests in flight relies on."""
    with KafkaWire(two_brokers.bootstrap) as wire:
        producer = init_producer_id(wire)
        requests = [
            produce_request(
                topic,
                0,
                batch_of(
                    [f"{n}-{i}".encode() for i in range(3)],
                    producer_id=producer.producer_id,
                    producer_epoch=producer.producer_epoch,
                    base_sequence=3 * n,
                ),
            )
            for n in range(5)
        ]
        for request in requests:
            wire.send(request)
        answers = [wire.receive(r).responses[0].partition_responses[0] for r in requests]

    assert [(a.error_code, a.base_offset) for a in answers] == [
        (ErrorCode.none, 3 * n) for n in range(5)
    ]
    assert [r.value for r in stored_records(two_brokers, topic, 0)] == [
        f"{n}-{i}".encode() for n in range(5) for i in range(3)
    ]


def test_producer_ids_are_unique_across_brokers(two_brokers: RunningIcefloe) -> None:
    with (
        KafkaWire(two_brokers.broker_address(0)) as first,
        KafkaWire(two_brokers.broker_address(1)) as second,
    ):
        answers = [init_producer_id(w) for w in (first, second, first, second)]

    assert all(a.error_code == ErrorCode.none and a.producer_epoch == 0 for a in answers)
    assert len({a.producer_id for a in answers}) == len(answers)


def test_a_transactional_id_gets_a_producer_id_and_each_new_instance_a_newer_epoch(
    two_brokers: RunningIcefloe,
) -> None:
    with KafkaWire(two_brokers.bootstrap) as wire:
        first = init_producer_id(wire, transactional_id="orders")
        second = init_producer_id(wire, transactional_id="orders")

    assert first.error_code == second.error_code == ErrorCode.none
    assert second.producer_id == first.producer_id >= 0
    assert second.producer_epoch == first.producer_epoch + 1


def test_transactional_records_outside_a_transaction_are_refused_and_not_stored(
    two_brokers: RunningIcefloe,
    topic: str,
) -> None:
    with KafkaWire(two_brokers.bootstrap) as wire:
        producer = init_producer_id(wire, transactional_id="strays")
        records = build_batch(
            [Record(0, int(time.time() * 1000), None, b"x")],
            producer_id=producer.producer_id,
            producer_epoch=producer.producer_epoch,
            base_sequence=0,
            is_transactional=True,
        )
        # No AddPartitionsToTxn first: the partition is in no transaction of this producer.
        answer = produce_answer(wire, topic, records, transactional_id="strays")

    assert answer.error_code == ErrorCode.invalid_txn_state
    assert log_end(two_brokers, topic, 0) == 0
