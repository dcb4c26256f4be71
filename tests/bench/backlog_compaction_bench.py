"""A broker compacting a log it was handed whole: time, CPU and memory, broker and workers apart.

    python -m tests.bench.backlog_compaction_bench DATA_DIR [--records 1500000]
        [--partitions 8] [--compactions 3] [--icefloe-env ICEFLOE_KEY=VALUE ...]

On first use (``DATA_DIR`` holds no log yet), starts `icefloe serve` (embedded default,
latency profile) on ``DATA_DIR`` with compaction off and sends ``--records`` 1 KiB records to
a topic of ``--partitions`` partitions with Kafka's ProducerPerformance. Then,
``--compactions`` times, copies ``DATA_DIR`` aside, starts a broker on the copy that compacts
at once (with the ``--icefloe-env`` settings) and waits until every record is in tables:
prints the seconds that took, the CPU of the whole server, of the broker process alone and of
its compactor's process (as its ``icefloe_compactor_cpu_seconds_total`` says; none with
``ICEFLOE_COMPACTOR__OWN_PROCESS=false``, where the broker's CPU holds it) since they started
(the rest is the compaction workers'), and the server's peak RSS. Keeping
``DATA_DIR`` lets two trees be compared on the same log (``PYTHONPATH=other/core/src:.``),
interleaved.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import DEFAULT_LIB, ensure_jars, find_java
from tests.bench.sidebyside.procstats import (
    broker_cpu_seconds,
    server_cpu_seconds,
    server_peak_rss_mib,
)
from tests.bench.sidebyside.workloads import producer_performance
from tests.support.metrics import scrape, total
from tests.support.topics import create_topic

TOPIC = "backlog"
RECORD_BYTES = 1024
LOADED_MARK = "loaded.json"
"""Written into ``DATA_DIR`` once its log is complete, with the record count."""
COMPACTION_OFF = {"ICEFLOE_COMPACTOR__ENABLED": "false"}


def load(data: Path, records: int, partitions: int) -> None:
    """``data`` holding ``records`` records of the topic, none of them compacted."""
    mark = data / LOADED_MARK
    if mark.exists():
        loaded = json.loads(mark.read_text())
        if (loaded["records"], loaded["partitions"]) != (records, partitions):
            raise SystemExit(
                f"{data} holds {loaded['records']} records in {loaded['partitions']} partitions"
            )
        return
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    java = find_java(ensure_jars(DEFAULT_LIB))
    server = icefloe_server.start(data, "latency", 1, COMPACTION_OFF)
    try:
        create_topic(server.running, TOPIC, partitions)
        producer_performance(java, server, TOPIC, records, RECORD_BYTES)
    finally:
        server.stop()
    mark.write_text(json.dumps({"records": records, "partitions": partitions}))


def compact_once(data: Path, records: int, settings: dict[str, str]) -> dict[str, float]:
    """Compact a copy of ``data``'s log on a fresh broker; what it took."""
    work = data.with_name(data.name + ".compacting")
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(data, work)
    try:
        server = icefloe_server.start(work, "latency", 1, settings, compact_at_once=True)
        try:
            roots = server.pids()
            started = time.monotonic()
            icefloe_server.wait_until_compacted(work, TOPIC, 300 + records / 1_000, settings)
            seconds = time.monotonic() - started
            compactor_cpu = sum(
                total(scrape(url), "icefloe_compactor_cpu_seconds_total")
                for url in server.running.metrics_urls
            )
            return {
                "seconds": seconds,
                "server_cpu_s": server_cpu_seconds(roots),
                "broker_cpu_s": broker_cpu_seconds(roots),
                "compactor_cpu_s": compactor_cpu,
                "peak_rss_mib": server_peak_rss_mib(roots),
            }
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.backlog_compaction_bench")
    parser.add_argument("data", type=Path, help="where the uncompacted log is (or will be)")
    parser.add_argument("--records", type=int, default=1_500_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--compactions", type=int, default=3, help="0: only load DATA_DIR")
    icefloe_server.add_icefloe_env(parser, "a setting of the brokers that compact")
    args = parser.parse_args()
    settings = dict(args.icefloe_env)
    load(args.data, args.records, args.partitions)
    results = []
    for n in range(args.compactions):
        result = compact_once(args.data, args.records, settings)
        results.append(result)
        print(
            f"compaction {n + 1}: {result['seconds']:.1f} s, server CPU "
            f"{result['server_cpu_s']:.1f} s (broker {result['broker_cpu_s']:.1f} s, its "
            f"compactor's process {result['compactor_cpu_s']:.1f} s), "
            f"peak RSS {result['peak_rss_mib']:.0f} MiB",
            flush=True,
        )
    if results:
        medians = {k: statistics.median(r[k] for r in results) for k in results[0]}
        print(
            f"median of {len(results)}: {medians['seconds']:.1f} s, server CPU "
            f"{medians['server_cpu_s']:.1f} s (broker {medians['broker_cpu_s']:.1f} s, its "
            f"compactor's process {medians['compactor_cpu_s']:.1f} s), "
            f"peak RSS {medians['peak_rss_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
