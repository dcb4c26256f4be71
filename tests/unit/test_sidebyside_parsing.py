"""The side-by-side harness reads what Kafka's performance tools print (captured output)."""

from __future__ import annotations

import pytest

from tests.bench.sidebyside.workloads import (
    WorkloadError,
    parse_consumer_summary,
    parse_producer_summary,
)

PRODUCER_OUTPUT = """\
350048 records sent, 70009.6 records/sec (68.37 MB/sec), 288.2 ms avg latency, 602.0 ms max latency.
700000 records sent, 69930.069930 records/sec (68.29 MB/sec), 365.73 ms avg latency, 1137.00 ms \
max latency, 350 ms 50th, 758 ms 95th, 1028 ms 99th, 1099 ms 99.9th.

Metric Name                                                              Value
producer-metrics:request-latency-avg:{client-id=perf-producer-client}  : 40.848
producer-metrics:request-total:{client-id=perf-producer-client}        : 1404.000
producer-node-metrics:request-latency-avg:{client-id=perf-producer-client, node-id=node-1} : 7.0
"""

CONSUMER_OUTPUT = """\
start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, \
rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec
2026-11-30 01:31:06:213, 2026-11-30 01:31:07:511, 19.5313, 15.0472, 20000, 15408.3205, 844, \
454, 43.0204, 44052.8634

Metric Name                                                                                  Value
consumer-fetch-manager-metrics:fetch-latency-avg:{client-id=perf-consumer-client}        : 51.000
consumer-fetch-manager-metrics:fetch-size-avg:{client-id=perf-consumer-client, topic=t}  : 9.0
consumer-fetch-manager-metrics:fetch-size-avg:{client-id=perf-consumer-client}    : 6886666.667
"""


def test_the_producer_summary_is_the_last_full_line_and_the_clients_totals_join_it() -> None:
    measures = parse_producer_summary(PRODUCER_OUTPUT)
    assert measures["records"] == 700000
    assert measures["mb_s"] == 68.29
    assert (measures["p50_ms"], measures["p99_ms"]) == (350, 1028)
    assert measures["request_latency_ms"] == 40.848
    assert measures["requests"] == 1404


def test_the_consumer_summary_row_and_the_clients_own_fetch_totals_not_a_topics() -> None:
    measures = parse_consumer_summary(CONSUMER_OUTPUT)
    assert measures["records"] == 20000
    assert measures["fetch_mb_s"] == 43.0204
    assert measures["rebalance_ms"] == 844
    assert measures["fetch_latency_ms"] == 51.0
    assert measures["fetch_bytes"] == 6886666.667


def test_outputs_without_the_metrics_still_give_their_summaries() -> None:
    consumer = parse_consumer_summary(CONSUMER_OUTPUT.split("\n\n")[0])
    producer = parse_producer_summary(PRODUCER_OUTPUT.split("\n\n")[0])
    assert "fetch_latency_ms" not in consumer
    assert consumer["fetch_mb_s"] == 43.0204
    assert "requests" not in producer
    assert producer["mb_s"] == 68.29


def test_an_output_without_a_summary_is_a_workload_error() -> None:
    with pytest.raises(WorkloadError, match="no summary"):
        parse_consumer_summary("org.apache.kafka.common.errors.TimeoutException: boom\n")
    with pytest.raises(WorkloadError, match="no summary line"):
        parse_producer_summary("350048 records sent, 70009.6 records/sec (68.37 MB/sec)\n")
