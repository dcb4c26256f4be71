"""What ingesting costs on S3 (MinIO here), as `icefloe cost` reports it, per flush profile.

    python -m tests.bench.cost_bench [--mb 512] [--profiles cost,latency] [--partitions 8]

For each profile: a fresh `icefloe serve` on MinIO, a confluent-kafka producer (acks=all,
1 KiB records of random bytes, each its own) writes --mb MiB into one topic, compaction runs
until nothing is left in the WAL, then `icefloe cost --json` reads the brokers' counters.
Prints requests per GB and dollars per GB at S3 Standard prices. Random values do not
compress, so Parquet is about as large as the data; real payloads compress and pay less
storage.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.bench.sidebyside.confluent_producer import Deliveries
from tests.support.broker import start_icefloe
from tests.support.object_servers import icefloe_on_minio

RECORD_BYTES = 1024


def run(profile: str, mb: int, partitions: int, workdir: Path) -> dict[str, Any]:
    data = workdir / f"data-{profile}"
    env = icefloe_on_minio(f"cost-bench-{profile}-{int(time.time())}") | {
        "ICEFLOE_STORAGE__PROFILE": profile,
        "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
        "ICEFLOE_COMPACTOR__MAX_AGE_S": "5",
    }
    running = start_icefloe(data, env=env, yielding=True)
    try:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic("billed", partitions)])["billed"].result(30)
        records = mb * (1 << 20) // RECORD_BYTES
        produced = produce(running.bootstrap, "billed", records)
        cost = _wait_for_compaction(data, env)
    finally:
        running.stop()
    return {"profile": profile, "produced": produced, "cost": cost}


def produce(bootstrap: str, topic: str, records: int) -> dict[str, Any]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    deliveries = Deliveries()
    started = time.monotonic()
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, os.urandom(RECORD_BYTES), on_delivery=deliveries)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(300)
    seconds = time.monotonic() - started
    ms = sorted(x * 1000 for x in deliveries.latencies) or [float("nan")]
    return {
        "acknowledged": len(deliveries.latencies),
        "errors": deliveries.errors,
        "mb_s": len(deliveries.latencies) * RECORD_BYTES / (1 << 20) / seconds,
        "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
    }


def _wait_for_compaction(data: Path, env: dict[str, str]) -> dict[str, Any]:
    """`icefloe cost --json` once compaction has taken in everything the WAL held."""
    deadline = time.monotonic() + 600
    while True:
        report = _cost(data, env)
        # Compaction counts batch bytes, as ingest does (WAL objects add their own framing).
        done = report["compacted_wal_bytes"] >= report["ingested_bytes"]
        if done or time.monotonic() > deadline:
            return report
        time.sleep(2)


def _cost(data: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "icefloe", "cost", "--data-dir", str(data), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}, **env},
        check=True,
    )
    return dict(json.loads(done.stdout))


def summary(result: dict[str, Any]) -> str:
    cost, produced = result["cost"], result["produced"]
    gb = cost["ingested_bytes"] / 1e9
    per_gb = cost["dollars_per_gb"]
    puts = cost["requests"].get("PUT", 0) + cost["requests"].get("LIST", 0)
    gets = cost["requests"].get("GET", 0) + cost["requests"].get("HEAD", 0)
    return (
        f"{result['profile']:>8}: {gb:.2f} GB at {produced['mb_s']:.1f} MiB/s "
        f"(p99 {produced['p99_ms']:.0f} ms); WAL objects {cost['wal_objects']:.0f} "
        f"({cost['wal_objects'] / gb:,.0f}/GB); PUT+LIST {puts / gb:,.0f}/GB, "
        f"GET+HEAD {gets / gb:,.0f}/GB; $/GB requests {per_gb['requests']:.5f}, "
        f"with a month of Parquet {per_gb['total']:.5f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512)
    parser.add_argument("--profiles", default="cost,latency")
    parser.add_argument("--partitions", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="icefloe-cost-bench-") as workdir:
        for profile in args.profiles.split(","):
            result = run(profile, args.mb, args.partitions, Path(workdir))
            print(summary(result), flush=True)
            print(json.dumps(result), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
