"""Catch-up reads from the WAL over the wire: Kafka's ConsumerPerformance, compaction off.

    python -m tests.bench.log_catchup_bench DATA_DIR [--records 1500000] [--partitions 8]
        [--starts 1] [--reads 2] [--icefloe-env ICEFLOE_KEY=VALUE ...]

On first use, loads ``DATA_DIR`` as ``backlog_compaction_bench`` does (``--records`` 1 KiB
records from Kafka's ProducerPerformance in ``--partitions`` partitions, compaction off; the
two benchmarks share such a folder). Then ``--starts`` times, starts a broker on it with
compaction off (and the ``--icefloe-env`` settings) and reads the topic from the start
``--reads`` times with ConsumerPerformance, a fresh group each time: prints each read's MB/s
while fetching and the broker's CPU seconds. The first read after a start finds nothing cached
in the broker; the later ones find its caches warm. Keeping ``DATA_DIR`` lets two trees be
compared on the same WAL (``PYTHONPATH=other/core/src:.``), interleaved.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from tests.bench.backlog_compaction_bench import COMPACTION_OFF, TOPIC, load
from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import DEFAULT_LIB, Java, ensure_jars, find_java
from tests.bench.sidebyside.workloads import consumer_performance, measured


def reads(
    java: Java, data: Path, records: int, settings: dict[str, str], count: int
) -> Iterator[dict[str, float]]:
    """``count`` reads of the whole topic by one broker started for them."""
    server = icefloe_server.start(data, "latency", 1, settings)
    try:
        for _ in range(count):
            yield measured(server, lambda: consumer_performance(java, server, TOPIC, records))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.log_catchup_bench")
    parser.add_argument("data", type=Path, help="where the topic is (or will be)")
    parser.add_argument("--records", type=int, default=1_500_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--starts", type=int, default=1, help="brokers started in turn")
    parser.add_argument("--reads", type=int, default=2, help="reads of the topic per start")
    icefloe_server.add_icefloe_env(parser, "a setting of the brokers that read")
    args = parser.parse_args()
    settings = COMPACTION_OFF | dict(args.icefloe_env)
    load(args.data, args.records, args.partitions)
    java = find_java(ensure_jars(DEFAULT_LIB))
    for start in range(1, args.starts + 1):
        for read, result in enumerate(
            reads(java, args.data, args.records, settings, args.reads), 1
        ):
            print(
                f"start {start}, read {read}: {result['fetch_mb_s']:.1f} MB/s while "
                f"fetching, broker CPU {result['broker_cpu_s']:.2f} s, "
                f"{result['broker_page_faults']:,.0f} page faults",
                flush=True,
            )


if __name__ == "__main__":
    main()
