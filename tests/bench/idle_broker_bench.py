"""What an idle broker costs: its own CPU while nothing is produced or consumed.

    python -m tests.bench.idle_broker_bench [--partitions 400] [--rest 60] [--seconds 60]

Starts `icefloe serve` (embedded default, one broker), creates topics of 50 partitions, writes
a few records to every partition, lets the background compaction take them into tables
(``--rest`` seconds), then reports the broker process's own CPU seconds over ``--seconds``.
Extra ``ICEFLOE_…=value`` arguments configure the broker (e.g. the compactor's interval).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from confluent_kafka import Producer

from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.procstats import own_cpu_seconds
from tests.support.topics import create_topic

PARTITIONS_PER_TOPIC = 50
RECORDS_PER_PARTITION = 5


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.idle_broker_bench")
    parser.add_argument("--partitions", type=int, default=400, help="a multiple of 50")
    parser.add_argument("--rest", type=float, default=60.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured")
    parser.add_argument(
        "settings", nargs="*", type=icefloe_server.setting, metavar="ICEFLOE_KEY=VALUE"
    )
    args = parser.parse_args()
    settings = dict(args.settings)
    topics = [f"idle{t}" for t in range(args.partitions // PARTITIONS_PER_TOPIC)]
    with tempfile.TemporaryDirectory(prefix="icefloe-idle-") as tmp:
        server = icefloe_server.start(Path(tmp) / "data", "latency", 1, settings)
        try:
            producer = Producer({"bootstrap.servers": server.bootstrap})
            for topic in topics:
                create_topic(server.running, topic, PARTITIONS_PER_TOPIC)
                for partition in range(PARTITIONS_PER_TOPIC):
                    for _ in range(RECORDS_PER_PARTITION):
                        producer.produce(topic, b"x" * 100, partition=partition)
            if producer.flush(60):
                raise RuntimeError("records still unacknowledged after 60 s")
            time.sleep(args.rest)
            [pid] = server.pids()
            before = own_cpu_seconds(pid)
            time.sleep(args.seconds)
            used = own_cpu_seconds(pid) - before
        finally:
            server.stop()
    print(
        f"{len(topics) * PARTITIONS_PER_TOPIC} partitions: the idle broker used {used:.2f} s "
        f"of CPU in {args.seconds:.0f} s ({100 * used / args.seconds:.1f}% of a core)"
    )


if __name__ == "__main__":
    main()
