"""Kafka's Java producer against Icefloe under several settings, interleaved, a fresh server each.

    python -m tests.bench.java_producer_variants [--records 700000] [--rounds 3]
        NAME[:ICEFLOE_KEY=VALUE,...] ...

Each round runs every variant once, in the order given: it starts `icefloe serve` (embedded
default, latency profile, compaction off, plus the variant's settings) in a fresh folder,
creates an 8-partition topic and sends ``--records`` 1 KiB records with ProducerPerformance and
its defaults. Prints each run as it ends, then each variant's medians: MB/s, p99 ms, the
client's request count and average request latency, and the broker's CPU seconds. A variant
with no settings (``base``) runs the defaults. For example::

    python -m tests.bench.java_producer_variants base interval2:ICEFLOE_STORAGE__FLUSH_INTERVAL_MS=2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import DEFAULT_LIB, Java, ensure_jars, find_java
from tests.bench.sidebyside.workloads import Measures, measured, producer_performance
from tests.support.topics import create_topic

TOPIC = "variants"
PARTITIONS = 8
RECORD_BYTES = 1024
NO_COMPACTION = {"ICEFLOE_COMPACTOR__ENABLED": "false"}
SHOWN = ("mb_s", "p99_ms", "requests", "request_latency_ms", "broker_cpu_s")
"""The measures printed, in this order."""


def variant(item: str) -> tuple[str, dict[str, str]]:
    """``NAME[:ICEFLOE_KEY=VALUE,...]`` as an argparse ``type``."""
    name, _, items = item.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"{item!r}: a variant needs a name before the ':'")
    return name, dict(icefloe_server.setting(i) for i in items.split(",") if i)


def run_once(java: Java, folder: Path, records: int, settings: dict[str, str]) -> Measures:
    server = icefloe_server.start(folder, "latency", 1, NO_COMPACTION | settings)
    try:
        create_topic(server.running, TOPIC, PARTITIONS)
        time.sleep(1)  # past the start's own work
        return measured(
            server, lambda: producer_performance(java, server, TOPIC, records, RECORD_BYTES)
        )
    finally:
        server.stop()


def shown(measures: Measures) -> str:
    return ", ".join(f"{key} {measures[key]:.1f}" for key in SHOWN if key in measures)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.java_producer_variants")
    parser.add_argument("variants", nargs="+", type=variant, metavar="NAME[:KEY=VALUE,...]")
    parser.add_argument("--records", type=int, default=700_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    names = [name for name, _ in args.variants]
    if len(set(names)) != len(names):
        parser.error(f"variant names must differ: {names}")
    java = find_java(ensure_jars(DEFAULT_LIB))
    runs: dict[str, list[Measures]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="icefloe-variants-") as scratch:
        for round_number in range(1, args.rounds + 1):
            for name, settings in args.variants:
                folder = Path(scratch) / name
                shutil.rmtree(folder, ignore_errors=True)
                folder.mkdir()
                measures = run_once(java, folder, args.records, settings)
                runs[name].append(measures)
                print(f"round {round_number}, {name}: {shown(measures)}", flush=True)
    for name, measured_runs in runs.items():
        medians = {
            key: statistics.median(run[key] for run in measured_runs)
            for key in SHOWN
            if all(key in run for run in measured_runs)
        }
        print(f"median of {name}: {shown(medians)}")


if __name__ == "__main__":
    main()
