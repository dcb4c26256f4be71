"""Bad input gets a precise Kafka error or a closed connection, and harms nothing.

Each test sends one kind of bad frame over a raw socket, while a bystander connection opened
before it stays open; afterwards the bystander still gets answers and the stored records are
exactly what they were.
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode

from icefloe.storage.records import Record
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_wire import (
    KafkaWire,
    batch_of,
    decode_response,
    encode_request,
    fetch_request,
    produce_request,
    request_module,
)
from tests.support.topics import create_topic, log_end, stored_records

TOPIC = "guarded"
MAX_REQUEST_BYTES = 1 << 20


@pytest.fixture(scope="module")
def icefloe_guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    """A broker with a 1 MiB request limit and a topic holding three records."""
    running = start_icefloe(
        tmp_path_factory.mktemp("bad-input") / "data",
        env={"ICEFLOE_BROKER__MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES)},
    )
    create_topic(running, TOPIC, 1)
    with KafkaWire(running.bootstrap) as wire:
        wire.request(produce_request(TOPIC, 0, batch_of([b"one", b"two", b"three"])))
    yield running
    running.stop()


@dataclass
class Bystander:
    """A connection opened before the bad input, and the stored state it must still see."""

    icefloe: RunningIcefloe
    wire: KafkaWire
    records: list[Record]

    def assert_unharmed(self) -> None:
        answer = self.wire.request(fetch_request(TOPIC, 0, 0)).responses[0].partitions[0]
        assert answer.error_code == ErrorCode.none
        assert answer.high_watermark == len(self.records)
        assert log_end(self.icefloe, TOPIC, 0) == len(self.records)
        assert stored_records(self.icefloe, TOPIC, 0) == self.records


@pytest.fixture
def bystander(icefloe_guarded: RunningIcefloe) -> Iterator[Bystander]:
    with KafkaWire(icefloe_guarded.bootstrap) as wire:
        wire.request(ApiVersionsRequest(client_software_name="t", client_software_version="1"))
        yield Bystander(icefloe_guarded, wire, stored_records(icefloe_guarded, TOPIC, 0))


@pytest.fixture
def attacker(icefloe_guarded: RunningIcefloe) -> Iterator[KafkaWire]:
    with KafkaWire(icefloe_guarded.bootstrap) as wire:
        yield wire


def produce_answer(wire: KafkaWire, records: bytes) -> Any:
    response = wire.request(produce_request(TOPIC, 0, records))
    return response.responses[0].partition_responses[0]


def frame(api_key: int, version: int, body: bytes = b"") -> bytes:
    """A size-prefixed frame with a v1 request header (no client id) and ``body``."""
    payload = struct.pack(">hhih", api_key, version, 7, -1) + body
    return struct.pack(">i", len(payload)) + payload


def test_a_frame_over_the_request_limit_closes_the_connection(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    attacker.send_frame(struct.pack(">i", MAX_REQUEST_BYTES + 1) + bytes(4096))
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_a_negative_frame_size_closes_the_connection(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    attacker.send_frame(struct.pack(">i", -5) + bytes(16))
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_a_batch_with_a_wrong_crc_is_a_corrupt_message(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    batch = bytearray(batch_of([b"tampered"]))
    batch[-1] ^= 0xFF  # a record byte, covered by the CRC

    answer = produce_answer(attacker, bytes(batch))

    assert answer.error_code == ErrorCode.corrupt_message
    assert "CRC" in (answer.error_message or "")
    bystander.assert_unharmed()


def test_two_batches_for_one_partition_are_an_invalid_record(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    answer = produce_answer(attacker, batch_of([b"a"]) + batch_of([b"b"]))

    assert answer.error_code == ErrorCode.invalid_record
    bystander.assert_unharmed()


def test_a_truncated_batch_is_a_corrupt_message(attacker: KafkaWire, bystander: Bystander) -> None:
    answer = produce_answer(attacker, batch_of([b"cut short"])[:-3])

    assert answer.error_code == ErrorCode.corrupt_message
    bystander.assert_unharmed()


def test_an_unknown_api_key_closes_the_connection(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    attacker.send_frame(frame(api_key=999, version=0))
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


@pytest.mark.parametrize("version", [2, 99])
def test_an_unsupported_produce_version_closes_the_connection(
    attacker: KafkaWire, bystander: Bystander, version: int
) -> None:
    attacker.send_frame(frame(api_key=0, version=version, body=bytes(64)))
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_an_unsupported_api_versions_version_is_answered(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    request = ApiVersionsRequest(client_software_name="t", client_software_version="1")
    raw = bytearray(encode_request(request, correlation_id=41, client_id="t"))
    struct.pack_into(">h", raw, 6, 99)  # the request api version, after size and api key
    attacker.send_frame(bytes(raw))

    answer = decode_response(18, 0, attacker.receive_frame())

    assert answer.error_code == ErrorCode.unsupported_version
    assert any(api.api_key == 0 for api in answer.api_keys)  # tells the client what it can use
    bystander.assert_unharmed()


def test_random_bytes_close_the_connection(attacker: KafkaWire, bystander: Bystander) -> None:
    noise = random.Random(20240601).randbytes(200)
    attacker.send_frame(struct.pack(">i", len(noise)) + noise)
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_a_produce_request_that_does_not_decode_closes_the_connection(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    attacker.send_frame(frame(api_key=0, version=9, body=b"\x00\x01"))
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_a_huge_array_length_closes_the_connection_and_the_broker_lives(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    # Metadata v12 whose topics array claims 2^32 - 2 elements: 24 bytes once killed a broker.
    header = struct.pack(">hhih", 3, 12, 7, 1) + b"x\x00"
    payload = header + b"\xff\xff\xff\xff\x0f\x01\x00\x00"
    attacker.send_frame(struct.pack(">i", len(payload)) + payload)
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_a_produce_with_null_topic_data_closes_the_connection(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    # Produce v9: null transactional id, acks -1, timeout, then topic_data as null.
    body = b"\x00" + struct.pack(">hi", -1, 30_000) + b"\x00" + b"\x00"
    payload = struct.pack(">hhih", 0, 9, 7, 1) + b"x\x00" + body
    attacker.send_frame(struct.pack(">i", len(payload)) + payload)
    assert attacker.is_closed_by_peer()
    bystander.assert_unharmed()


def test_topic_names_no_topic_can_have_are_unknown_topics(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    for name in (f"{TOPIC}\x00", "", "a/b", "x" * 300):
        produced = produce_answer_for(attacker, name)
        fetched = attacker.request(fetch_request(name, 0, 0)).responses[0].partitions[0]
        assert produced.error_code == ErrorCode.unknown_topic_or_partition, repr(name)
        assert fetched.error_code == ErrorCode.unknown_topic_or_partition, repr(name)
    bystander.assert_unharmed()


def produce_answer_for(wire: KafkaWire, topic: str) -> Any:
    response = wire.request(produce_request(topic, 0, batch_of([b"x"])))
    return response.responses[0].partition_responses[0]


def test_a_metadata_v11_request_naming_a_topic_only_by_id_is_invalid(
    attacker: KafkaWire, bystander: Bystander
) -> None:
    m = request_module("metadata", 11)
    request = m.MetadataRequest(
        topics=(m.MetadataRequestTopic(topic_id=uuid.uuid4(), name=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    (topic,) = attacker.request(request).topics
    assert topic.error_code == ErrorCode.invalid_request
    bystander.assert_unharmed()
