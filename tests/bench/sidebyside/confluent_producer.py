"""A confluent-kafka producer as fast as it goes; prints its result as one JSON line.

    python -m tests.bench.sidebyside.confluent_producer --bootstrap HOST:PORT --topic T
                                                        --records N [--record-bytes 1024]

librdkafka's defaults plus acks=all and linger.ms=5, null keys (its sticky partitioner).
Throughput is measured from the first produce() to the last acknowledgement; MB are 2^20
bytes, as Kafka's tools count them. Run by the side-by-side harness in a child process, so
that it can be given a timeout.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import confluent_kafka

MIB = 1 << 20
FLUSH_TIMEOUT_S = 300


class Deliveries:
    """Counts acknowledgements and keeps the delivery latency of each and the first errors."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors = 0
        self.first_errors: list[str] = []

    def __call__(self, error: Any, message: Any) -> None:
        if error is None:
            self.latencies.append(message.latency())
            return
        self.errors += 1
        if len(self.first_errors) < 3:
            self.first_errors.append(str(error))


def produce(bootstrap: str, topic: str, records: int, record_bytes: int) -> dict[str, Any]:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5}
    )
    value = os.urandom(record_bytes)
    deliveries = Deliveries()
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, value, on_delivery=deliveries)
                break
            except BufferError:
                producer.poll(0.01)
        if i % 1000 == 0:
            producer.poll(0)
    unsent = producer.flush(FLUSH_TIMEOUT_S)
    seconds = time.monotonic() - started
    ms = sorted(x * 1000 for x in deliveries.latencies) or [float("nan")]
    return {
        "records": records,
        "acknowledged": len(deliveries.latencies),
        "errors": deliveries.errors,
        "first_errors": deliveries.first_errors,
        "unsent": unsent,
        "seconds": seconds,
        "mb_s": len(deliveries.latencies) * record_bytes / MIB / seconds,
        "records_s": len(deliveries.latencies) / seconds,
        "p50_ms": ms[len(ms) // 2],
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--record-bytes", type=int, default=1024)
    args = parser.parse_args()
    print(json.dumps(produce(args.bootstrap, args.topic, args.records, args.record_bytes)))


if __name__ == "__main__":
    main()
