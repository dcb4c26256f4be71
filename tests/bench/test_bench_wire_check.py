"""What the frame bounds check adds to decoding a request, on the produce and fetch paths.

Compare each ``check+decode`` figure with its ``decode`` twin. Run with
``.venv/bin/pytest tests/bench/test_bench_wire_check.py --benchmark-enable``.
"""

from __future__ import annotations

import datetime
import os

import pytest
from kio.schema.fetch.v12 import request as fetch
from kio.schema.produce.v9 import request as produce
from kio.static.primitive import i16, i32, i64
from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.broker import protocol
from icefloe.broker.wire_check import check_request
from icefloe.storage.records import Record, build_batch
from tests.support.kafka_wire import encode_request

PARTITIONS = 8


def produce_frame() -> bytes:
    """One topic, 8 partitions, a 16 KiB batch each: what a librdkafka produce looks like."""
    batch = build_batch([Record(i, 1_700_000_000_000, None, os.urandom(1024)) for i in range(15)])
    partitions = tuple(
        produce.PartitionProduceData(index=i32(p), records=batch) for p in range(PARTITIONS)
    )
    body = produce.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(produce.TopicProduceData(name="bench", partition_data=partitions),),
    )
    return encode_request(body, 1, "bench")[4:]


def fetch_frame(partitions: int) -> bytes:
    wanted = tuple(
        fetch.FetchPartition(
            partition=i32(p), fetch_offset=i64(1 << 20), partition_max_bytes=i32(1 << 20)
        )
        for p in range(partitions)
    )
    body = fetch.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=i32(1),
        topics=(fetch.FetchTopic(topic="bench", partitions=wanted),),
        forgotten_topics_data=(),
        rack_id="",
    )
    return encode_request(body, 1, "bench")[4:]


FRAMES = {
    "produce-8x16KiB": (0, 9, produce_frame()),
    "fetch-8": (1, 12, fetch_frame(8)),
    "fetch-1000": (1, 12, fetch_frame(1000)),
}


@pytest.mark.parametrize("name", FRAMES)
def test_check_alone(benchmark: BenchmarkFixture, name: str) -> None:
    api_key, version, frame = FRAMES[name]
    benchmark(check_request, frame, api_key, version)


@pytest.mark.parametrize("name", FRAMES)
def test_check_and_decode(benchmark: BenchmarkFixture, name: str) -> None:
    _, _, frame = FRAMES[name]
    request = benchmark(protocol.decode_request, frame)
    assert request.correlation_id == 1
