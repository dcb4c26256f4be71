"""Produce through `icefloe serve` with confluent-kafka: throughput and acknowledgement latency.

    python tests/bench/produce_bench.py [--profile cost|latency] [--brokers N]
                                        [--records 200000] [--rate 1000] [--seconds 10]
                                        [--set ICEFLOE_SECTION__KEY=VALUE ...]

Starts `icefloe serve` on the embedded default (SQLite metadata, local files) in a fresh
temporary directory and creates an 8-partition topic. Then, with 1 KiB records, acks=all:

- throughput: the producer sends ``--records`` as fast as librdkafka batches them (linger
  5 ms), round-robin over the partitions; MB/s from the first send to the last ack, and the
  delivery latency (librdkafka's own produce()-to-ack time) of every record under that load;
- latency: ``--rate`` records per second for ``--seconds``, so acknowledgements are not
  queued behind a saturated pipeline; p50/p99 of the delivery latency.

``--set ICEFLOE_BROKER__EVENT_LOOP=asyncio`` runs the brokers on the standard library's event
loop instead of uvloop.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import confluent_kafka

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.sidebyside.icefloe_server import setting
from tests.support.broker import start_icefloe
from tests.support.topics import create_topic

RECORD_BYTES = 1024
PARTITIONS = 8
TOPIC = "bench"


def producer(bootstrap: str) -> confluent_kafka.Producer:
    return confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
        }
    )


class Deliveries:
    """Collects librdkafka's per-record latency (produce() to ack) and any errors."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[Any] = []

    def __call__(self, error: Any, message: Any) -> None:
        if error is not None:
            self.errors.append(error)
        else:
            self.latencies.append(message.latency())

    def summary(self) -> str:
        assert not self.errors, self.errors[:3]
        ms = sorted(x * 1000 for x in self.latencies)
        p50, p99 = ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]
        return f"latency p50 {p50:.1f} ms, p99 {p99:.1f} ms, mean {statistics.mean(ms):.1f} ms"


def throughput(bootstrap: str, records: int) -> str:
    p = producer(bootstrap)
    value = os.urandom(RECORD_BYTES)
    warm = Deliveries()
    for i in range(5_000):
        p.produce(TOPIC, value, partition=i % PARTITIONS, on_delivery=warm)
    p.flush(60)
    measured = Deliveries()
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                p.produce(TOPIC, value, partition=i % PARTITIONS, on_delivery=measured)
                break
            except BufferError:
                p.poll(0.01)
        if i % 1000 == 0:
            p.poll(0)
    assert p.flush(120) == 0
    elapsed = time.monotonic() - started
    mb_s = records * RECORD_BYTES / elapsed / 1e6
    return (
        f"throughput: {records} x 1 KiB in {elapsed:.1f}s = {mb_s:.1f} MB/s "
        f"({records / elapsed:,.0f} records/s); {measured.summary()}"
    )


def latency(bootstrap: str, rate: int, seconds: float) -> str:
    p = producer(bootstrap)
    value = os.urandom(RECORD_BYTES)
    measured = Deliveries()
    interval = 1 / rate
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < seconds:
        p.produce(TOPIC, value, partition=sent % PARTITIONS, on_delivery=measured)
        sent += 1
        p.poll(0)
        pause = start + sent * interval - time.monotonic()
        if pause > 0:
            time.sleep(pause)
    assert p.flush(60) == 0
    return f"latency at {rate} records/s: {measured.summary()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=["cost", "latency"], default="latency")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rate", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=setting,
        metavar="ICEFLOE_SECTION__KEY=VALUE",
        help="more configuration for the brokers, e.g. ICEFLOE_BROKER__MAX_INFLIGHT_REQUESTS=512",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        env = {"ICEFLOE_STORAGE__PROFILE": args.profile}
        env |= dict(args.set)
        running = start_icefloe(
            Path(scratch) / "data", brokers=args.brokers, env=env, yielding=True
        )
        try:
            create_topic(running, TOPIC, PARTITIONS)
            extra = " ".join(f"{key}={value}" for key, value in args.set)
            print(f"profile={args.profile} brokers={args.brokers} {extra}")
            print(throughput(running.bootstrap, args.records), flush=True)
            print(latency(running.bootstrap, args.rate, args.seconds), flush=True)
        finally:
            running.stop()


if __name__ == "__main__":
    main()
