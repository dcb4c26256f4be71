"""The metrics count every error code a response carries, however deep its schema nests it."""

from __future__ import annotations

import datetime

from kio.schema.errors import ErrorCode
from kio.schema.metadata.v12 import response as metadata
from kio.schema.produce.v9 import response as produce

from icefloe.broker.answered_errors import errors_in
from icefloe.broker.protocol import make


def partition(index: int, code: ErrorCode) -> produce.PartitionProduceResponse:
    return make(
        produce.PartitionProduceResponse,
        index=index,
        error_code=code,
        base_offset=-1,
        log_append_time=None,
        log_start_offset=-1,
        record_errors=(),
        error_message=None,
    )


def test_partition_errors_of_a_produce_response_are_each_counted() -> None:
    body = make(
        produce.ProduceResponse,
        responses=(
            make(
                produce.TopicProduceResponse,
                name="a",
                partition_responses=(
                    partition(0, ErrorCode.none),
                    partition(1, ErrorCode.not_leader_or_follower),
                ),
            ),
            make(
                produce.TopicProduceResponse,
                name="b",
                partition_responses=(partition(0, ErrorCode.unknown_topic_or_partition),),
            ),
        ),
    )
    assert sorted(errors_in(body), key=int) == sorted(
        [ErrorCode.unknown_topic_or_partition, ErrorCode.not_leader_or_follower], key=int
    )


def test_a_response_without_errors_yields_none() -> None:
    body = make(
        metadata.MetadataResponse,
        throttle_time=datetime.timedelta(0),
        brokers=(),
        cluster_id=None,
        controller_id=-1,
        topics=(),
    )
    assert list(errors_in(body)) == []
