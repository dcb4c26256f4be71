"""A rate-limited producer right after a burst: the client's latency and the broker's slow steps.

    python -m tests.bench.throttled_bench [--burst 300000] [--rate 5000] [--seconds 20]
        [ICEFLOE_KEY=VALUE ...]

Starts `icefloe serve` (embedded default, latency profile, one broker) and an 8-partition
topic, sends ``--burst`` 1 KiB records with Kafka's ProducerPerformance at full speed, rests
3 s, then sends ``--rate`` records a second for ``--seconds``. Prints the client's latency
percentiles, and from the broker's metrics over the rate-limited run how many WAL flushes and
produce requests took longer than 25 and 50 ms. The burst leaves the compaction leader a
backlog that is not due yet, as after any busy minute.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import DEFAULT_LIB, ensure_jars, find_java
from tests.bench.sidebyside.workloads import producer_performance
from tests.support.metrics import Samples, scrape, total
from tests.support.topics import create_topic

TOPIC = "bench"
RECORD_BYTES = 1024
SLOW = ("0.025", "0.05")
"""Histogram bounds (seconds) whose excess is reported."""


def slower_than(before: Samples, after: Samples, histogram: str, **labels: str) -> str:
    """``n=…`` observations of the run, and how many exceeded each bound of :data:`SLOW`."""

    def delta(name: str, **more: str) -> float:
        return total(after, name, **labels, **more) - total(before, name, **labels, **more)

    count = delta(histogram + "_count")
    over = [
        f">{float(b) * 1000:g} ms: {count - delta(histogram + '_bucket', le=b):.0f}" for b in SLOW
    ]
    return f"n={count:.0f}, " + ", ".join(over)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.throttled_bench")
    parser.add_argument("--burst", type=int, default=300_000, help="records sent at full speed")
    parser.add_argument("--rate", type=int, default=5_000, help="records a second afterwards")
    parser.add_argument("--seconds", type=int, default=20, help="how long at that rate")
    parser.add_argument(
        "settings", nargs="*", type=icefloe_server.setting, metavar="ICEFLOE_KEY=VALUE"
    )
    args = parser.parse_args()
    settings = dict(args.settings)
    java = find_java(ensure_jars(DEFAULT_LIB))
    with tempfile.TemporaryDirectory(prefix="icefloe-throttled-") as tmp:
        server = icefloe_server.start(Path(tmp) / "data", "latency", 1, settings)
        try:
            create_topic(server.running, TOPIC, 8)
            producer_performance(java, server, TOPIC, args.burst, RECORD_BYTES)
            time.sleep(3)
            [url] = server.running.metrics_urls
            before = scrape(url)
            records = args.rate * args.seconds
            client = producer_performance(java, server, TOPIC, records, RECORD_BYTES, args.rate)
            after = scrape(url)
        finally:
            server.stop()
    print(
        f"client: p50 {client['p50_ms']:.0f} ms, p99 {client['p99_ms']:.0f} ms, "
        f"max {client['max_ms']:.0f} ms"
    )
    print("WAL flushes:", slower_than(before, after, "icefloe_wal_flush_seconds"))
    print(
        "produce requests:",
        slower_than(before, after, "icefloe_kafka_request_seconds", api="produce"),
    )


if __name__ == "__main__":
    main()
