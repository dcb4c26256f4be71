"""The frame bounds checker: every well-formed request passes it unchanged, and no length
field, however it lies, reaches kio's decoder (which would abort the process)."""

from __future__ import annotations

import contextlib
import random
import struct

import pytest
from kio.index import load_request_schema

from icefloe.broker import protocol
from icefloe.broker.apis import SUPPORTED_APIS
from icefloe.broker.protocol import ProtocolError
from tests.support.kafka_samples import sample_entity
from tests.support.kafka_wire import encode_request

ADVERTISED = [
    (api.key, version)
    for api in SUPPORTED_APIS.values()
    for version in range(api.min_version, api.max_version + 1)
]
SEEDS = range(4)


def frame_of(body: object) -> bytes:
    return encode_request(body, 7, "wire-check")[4:]


def sample_frame(api_key: int, version: int, seed: int) -> bytes:
    body = sample_entity(load_request_schema(api_key, version), random.Random(seed))
    return frame_of(body)


def test_a_huge_array_length_is_refused_before_kio_allocates() -> None:
    # Metadata v12, header v2 (client id "x"), then topics as the varint ff ff ff ff 0f.
    frame = struct.pack(">hhih", 3, 12, 1, 1) + b"x\x00" + b"\xff\xff\xff\xff\x0f\x01\x00\x00"
    with pytest.raises(ProtocolError, match=r"MetadataRequest\.topics: .* cannot fit"):
        protocol.decode_request(frame)


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED)
def test_well_formed_requests_pass_and_decode_unchanged(api_key: int, version: int) -> None:
    for seed in SEEDS:
        body = sample_entity(load_request_schema(api_key, version), random.Random(seed))
        request = protocol.decode_request(frame_of(body))
        assert request.body == body, f"seed {seed}"
        assert request.correlation_id == 7


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED)
def test_lying_lengths_anywhere_are_refused_or_harmless(api_key: int, version: int) -> None:
    """Each position of a valid frame overwritten with a huge varint, int16 or int32."""
    lies = (b"\xff\xff\xff\xff\x0f", b"\x7f\xff", b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe")
    for seed in SEEDS:
        frame = sample_frame(api_key, version, seed)
        for position in range(4, len(frame)):
            for lie in lies:
                mutated = frame[:position] + lie + frame[position + len(lie) :]
                with contextlib.suppress(ProtocolError):
                    protocol.decode_request(mutated)


@pytest.mark.parametrize(("api_key", "version"), ADVERTISED)
def test_every_truncation_is_refused(api_key: int, version: int) -> None:
    frame = sample_frame(api_key, version, 0)
    for end in range(4, len(frame)):
        with pytest.raises(ProtocolError):
            protocol.decode_request(frame[:end])


def test_null_topic_data_in_produce_is_refused_as_kafka_refuses_it() -> None:
    header = struct.pack(">hhih", 0, 9, 1, 1) + b"x\x00"
    # Produce v9: null transactional id, acks -1, timeout, topic_data as 0 (null), no tags.
    body = b"\x00" + struct.pack(">hi", -1, 30_000) + b"\x00" + b"\x00"
    with pytest.raises(ProtocolError, match=r"ProduceRequest\.topic_data: null"):
        protocol.decode_request(header + body)


def test_a_tagged_field_that_overruns_its_declared_size_is_refused() -> None:
    header = struct.pack(">hhih", 18, 3, 1, 1) + b"x\x00"
    # ApiVersions v3: software name "a", version "b", then one tag (0, size 1) that is unknown.
    body = b"\x02a\x02b" + b"\x01\x00\x05\x00"
    with pytest.raises(ProtocolError, match="runs past the frame"):
        protocol.decode_request(header + body)
