"""Response frames: the bytes kio writes, with a fetch response's records sent from where they
are instead of copied into the frame."""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct

from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import response as fetch_v4
from kio.schema.fetch.v12 import response as fetch_v12
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_writer
from kio.static.primitive import i32

from icefloe.broker.protocol import BY_REFERENCE, RecordParts, encode_response, make

FETCH = 1


def partition(index: int, records: bytes | bytearray) -> fetch_v12.PartitionData:
    return make(
        fetch_v12.PartitionData,
        partition_index=index,
        error_code=ErrorCode.none,
        high_watermark=10,
        last_stable_offset=10,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=records,
    )


def fetch_response(*partitions: fetch_v12.PartitionData) -> fetch_v12.FetchResponse:
    return make(
        fetch_v12.FetchResponse,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(make(fetch_v12.FetchableTopicResponse, topic="t", partitions=partitions),),
    )


def written_by_kio(correlation_id: int, body: fetch_v12.FetchResponse) -> bytes:
    buffer = io.BytesIO()
    entity_writer(ResponseHeader)(buffer, ResponseHeader(correlation_id=i32(correlation_id)))
    entity_writer(fetch_v12.FetchResponse)(buffer, body)
    data = buffer.getvalue()
    return struct.pack(">i", len(data)) + data


def test_large_records_are_sent_from_the_handlers_buffer_and_the_frame_is_kios_bytes() -> None:
    large = bytearray(b"r" * BY_REFERENCE)
    body = fetch_response(partition(0, large), partition(1, b"small"), partition(2, b""))

    frame = encode_response(FETCH, 12, 7, body)

    assert any(part is large for part in frame.parts)
    assert b"".join(frame.parts) == written_by_kio(7, body)
    assert frame.size == sum(map(len, frame.parts))


def test_a_full_batch_of_the_java_producer_is_sent_by_reference() -> None:
    batch = bytearray(b"j" * 65_000)  # batch.size 64 KiB of 1 KiB records, as it arrives
    body = fetch_response(partition(0, RecordParts((batch, bytearray(batch)))))  # type: ignore[arg-type]

    frame = encode_response(FETCH, 12, 6, body)

    assert any(part is batch for part in frame.parts)
    assert frame.size == sum(map(len, frame.parts))


def test_a_frame_of_small_fields_is_one_buffer() -> None:
    body = fetch_response(partition(0, b"small"))

    frame = encode_response(FETCH, 12, 8, body)

    assert len(frame.parts) == 1
    assert bytes(frame.parts[0]) == written_by_kio(8, body)


def test_records_in_parts_are_written_in_order_never_joined() -> None:
    first, second = bytearray(b"a" * BY_REFERENCE), memoryview(b"b" * (2 * BY_REFERENCE))
    parts = (first, b"small", second)
    body = fetch_response(partition(0, RecordParts(parts)))  # type: ignore[arg-type]

    frame = encode_response(FETCH, 12, 9, body)

    assert any(part is first for part in frame.parts)
    assert any(part is second for part in frame.parts)
    joined = fetch_response(partition(0, b"".join(parts)))
    assert b"".join(frame.parts) == written_by_kio(9, joined)
    assert frame.size == sum(map(len, frame.parts))


def test_records_in_parts_keep_kios_bytes_in_a_non_flexible_version() -> None:
    parts = (b"x" * BY_REFERENCE, b"y" * 10)
    records = RecordParts(parts)
    body = make(
        fetch_v4.FetchResponse,
        throttle_time=datetime.timedelta(0),
        responses=(
            make(
                fetch_v4.FetchableTopicResponse,
                topic="t",
                partitions=(
                    make(
                        fetch_v4.PartitionData,
                        partition_index=0,
                        error_code=ErrorCode.none,
                        high_watermark=10,
                        last_stable_offset=10,
                        aborted_transactions=None,
                        records=records,
                    ),
                ),
            ),
        ),
    )

    frame = encode_response(FETCH, 4, 3, body)

    expected = dataclasses.replace(
        body,
        responses=(
            dataclasses.replace(
                body.responses[0],
                partitions=(
                    dataclasses.replace(body.responses[0].partitions[0], records=b"".join(parts)),
                ),
            ),
        ),
    )
    buffer = io.BytesIO()
    entity_writer(ResponseHeaderV0)(buffer, ResponseHeaderV0(correlation_id=i32(3)))
    entity_writer(fetch_v4.FetchResponse)(buffer, expected)
    assert b"".join(frame.parts) == struct.pack(">i", buffer.tell()) + buffer.getvalue()


def test_record_parts_of_no_part_or_one_part_are_plain_records() -> None:
    only = bytearray(b"z" * 3)
    assert RecordParts.of([]) == b""
    assert RecordParts.of([only]) is only
    assert len(RecordParts.of([only, b"12"])) == 5
