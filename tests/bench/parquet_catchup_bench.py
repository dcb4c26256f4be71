"""Catch-up reads from Parquet over the wire: Kafka's ConsumerPerformance against fresh brokers.

    python -m tests.bench.parquet_catchup_bench DATA_DIR [--records 500000] [--partitions 8]
        [--table-compression zstd] [--reads 3] [--icefloe-env ICEFLOE_KEY=VALUE ...]

On first use (``DATA_DIR`` has no compacted topic yet), starts `icefloe serve` (embedded
default, latency profile) on ``DATA_DIR``, sends ``--records`` 1 KiB records to a topic of
``--partitions`` partitions with Kafka's ProducerPerformance, and restarts it to compact the
whole log into Parquet data files of the ``--table-compression`` codec. Then, ``--reads``
times, starts a fresh broker on it (nothing cached; with the ``--icefloe-env`` settings) and
reads the topic from the start with ConsumerPerformance: prints each read's MB/s while
fetching and the broker's CPU seconds, and their medians. Keeping ``DATA_DIR`` lets two
trees be compared on the files each one wrote (``PYTHONPATH=other/core/src:.``), interleaved,
without producing again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

from icefloe.config.compactor import TableCodec
from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import DEFAULT_LIB, Java, ensure_jars, find_java
from tests.bench.sidebyside.workloads import consumer_performance, measured, producer_performance
from tests.support.topics import create_topic

TOPIC = "catchup"
RECORD_BYTES = 1024
MB = 1_000_000
COMPACTED_MARK = "compacted.json"
"""Written into ``DATA_DIR`` once its topic is all in Parquet, with the record count."""


def prepare(java: Java, data: Path, records: int, partitions: int, codec: str) -> int:
    """The records of the compacted topic in ``data``, producing and compacting it (into data
    files of ``codec``) first if it is not there yet."""
    mark = data / COMPACTED_MARK
    if mark.exists():
        prepared = json.loads(mark.read_text())
        if prepared.get("partitions", 8) != partitions:
            raise SystemExit(f"{data} holds a topic of {prepared.get('partitions', 8)} partitions")
        if prepared.get("codec", "zstd") != codec:
            raise SystemExit(f"{data} holds data files of {prepared.get('codec', 'zstd')}")
        return int(prepared["records"])
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    server = icefloe_server.start(data, "latency", 1)
    try:
        create_topic(server.running, TOPIC, partitions)
        producer_performance(java, server, TOPIC, records, RECORD_BYTES)
    finally:
        server.stop()
    settings = {"ICEFLOE_COMPACTOR__TABLE_COMPRESSION": codec}
    server = icefloe_server.start(data, "latency", 1, settings, compact_at_once=True)
    try:
        seconds = icefloe_server.wait_until_compacted(data, TOPIC, 300 + records / 1_000, settings)
    finally:
        server.stop()
    files = sum(f.stat().st_size for f in data.rglob("*.parquet"))
    print(
        f"produced {records} records and compacted them in {seconds:.1f} s "
        f"into {files / MB:.1f} MB of {codec} data files",
        flush=True,
    )
    mark.write_text(json.dumps({"records": records, "partitions": partitions, "codec": codec}))
    return records


def read_once(java: Java, data: Path, records: int, settings: dict[str, str]) -> dict[str, float]:
    server = icefloe_server.start(data, "latency", 1, settings)
    try:
        time.sleep(1)  # past the start's own work
        return measured(server, lambda: consumer_performance(java, server, TOPIC, records))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.parquet_catchup_bench")
    parser.add_argument("data", type=Path, help="where the compacted topic is (or will be)")
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--table-compression",
        choices=[codec.value for codec in TableCodec],
        default=TableCodec.ZSTD.value,
        help="the data files' codec, when DATA_DIR is prepared",
    )
    parser.add_argument("--reads", type=int, default=3, help="0: only prepare DATA_DIR")
    icefloe_server.add_icefloe_env(parser, "a setting of the brokers that read")
    args = parser.parse_args()
    settings = dict(args.icefloe_env)
    java = find_java(ensure_jars(DEFAULT_LIB))
    records = prepare(java, args.data, args.records, args.partitions, args.table_compression)
    rates, cpu = [], []
    for n in range(args.reads):
        result = read_once(java, args.data, records, settings)
        rates.append(result["fetch_mb_s"])
        cpu.append(result["broker_cpu_s"])
        print(
            f"read {n + 1}: {result['fetch_mb_s']:.1f} MB/s while fetching, "
            f"broker CPU {result['broker_cpu_s']:.2f} s, "
            f"{result['broker_page_faults']:,.0f} page faults",
            flush=True,
        )
    if rates:
        print(
            f"median of {args.reads}: {statistics.median(rates):.1f} MB/s, "
            f"broker CPU {statistics.median(cpu):.2f} s"
        )


if __name__ == "__main__":
    main()
