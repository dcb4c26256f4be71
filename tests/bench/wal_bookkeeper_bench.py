"""The BookKeeper WAL against the object WAL on the local store, on this machine.

    python -m tests.bench.wal_bookkeeper_bench [--rounds 3] [--appends 200] [--rate 5000]
                                               [--rate-seconds 10] [--records 300000]
                                               [--json PATH]

Starts a BookKeeper cluster of its own (ZooKeeper and three bookies, tests/support/bookkeeper.py;
ledgers on two of them, write and ack quorum two, as the plugin's defaults), then, round after
round, each WAL in turn (interleaved, so that drift on the machine hits both alike):

- ``append``: the WAL port alone, ``--appends`` sequential appends of 64 KiB, 256 KiB and
  1 MiB objects; p50/p99 of the time until the append returned (durable);
- ``producer_5000``: `icefloe serve` with nothing but ``[wal]`` changed, Kafka's Java producer
  (ProducerPerformance, acks=all, linger.ms=5, batch.size=65536, 1 KiB records, an 8-partition
  topic) at ``--rate`` records/s for ``--rate-seconds``: its p50/p99 latency;
- ``producer_max``: the same producer as fast as it goes for ``--records``: MB/s.

Every figure printed is the median over the rounds. Both WALs make every append durable before
it returns: the local store fsyncs the object and its folder; BookKeeper fsyncs the journal of
each bookie of the ack quorum, and ZooKeeper its transaction log for the ledger's metadata. All
of it runs on this one machine, so BookKeeper's replication costs CPU here and buys nothing:
the figures show its overhead, not what a second machine or zone would save. Not a pytest test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tests.bench.sidebyside.kafka import DEFAULT_LIB, create_kafka_topic, find_java
from tests.bench.sidebyside.workloads import producer_performance
from tests.support.bookkeeper import BookKeeperCluster, start_bookkeeper
from tests.support.broker import start_icefloe

SIZES = (64 << 10, 256 << 10, 1 << 20)
PARTITIONS = 8
RECORD_BYTES = 1024
WALS = ("bookkeeper", "object")


def wal_env(wal: str, cluster: BookKeeperCluster) -> dict[str, str]:
    if wal == "object":
        return {}
    env = {"ICEFLOE_WAL__BACKEND": "bookkeeper"}
    for key, value in cluster.wal_options(f"bench-{uuid.uuid4().hex[:8]}").items():
        env[f"ICEFLOE_WAL__BOOKKEEPER__{key.upper()}"] = str(value)
    return env


async def append_latencies(
    wal_name: str, cluster: BookKeeperCluster, appends: int
) -> dict[str, float]:
    from icefloe.ports.base import PortKind
    from icefloe.testing.contract import open_backend

    workdir = Path(tempfile.mkdtemp(prefix="icefloe-walbench-"))
    store = None
    if wal_name == "object":
        store = await open_backend(PortKind.OBJECT_STORE, "local", workdir, {"root": str(workdir)})
        options: dict[str, Any] = {"prefix": "wal"}
    else:
        options = cluster.wal_options(f"bench-{uuid.uuid4().hex[:8]}")
    wal: Any = await open_backend(PortKind.WAL, wal_name, workdir, options, object_store=store)
    out: dict[str, float] = {}
    try:
        for size in SIZES:
            data = os.urandom(size)
            for _ in range(10):  # warm up
                await wal.delete(await wal.append(data))
            times, refs = [], []
            for _ in range(appends):
                started = time.perf_counter()
                refs.append(await wal.append(data))
                times.append((time.perf_counter() - started) * 1000)
            for ref in refs:
                await wal.delete(ref)
            times.sort()
            label = f"{size >> 10}KiB"
            out[f"append_{label}_p50_ms"] = statistics.median(times)
            out[f"append_{label}_p99_ms"] = times[min(len(times) - 1, int(len(times) * 0.99))]
    finally:
        await wal.close()
        if store is not None:
            await store.close()
    return out


def producer_run(
    wal: str, cluster: BookKeeperCluster, args: argparse.Namespace
) -> dict[str, float]:
    java = find_java(DEFAULT_LIB)
    data_dir = Path(tempfile.mkdtemp(prefix="icefloe-walbench-serve-"))
    env = {**wal_env(wal, cluster), "ICEFLOE_TABLE__FORMATS": "[]"}
    running = start_icefloe(data_dir, env=env, timeout=120, yielding=True)
    try:
        create_kafka_topic(running.bootstrap, "rate", PARTITIONS)
        create_kafka_topic(running.bootstrap, "max", PARTITIONS)
        rated = producer_performance(
            java, running, "rate", args.rate * args.rate_seconds, RECORD_BYTES, args.rate
        )
        fastest = producer_performance(java, running, "max", args.records, RECORD_BYTES)
    finally:
        running.stop()
    return {
        "producer_5000_p50_ms": rated["p50_ms"],
        "producer_5000_p99_ms": rated["p99_ms"],
        "producer_max_mb_s": fastest["mb_s"],
        "producer_max_p99_ms": fastest["p99_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--rate-seconds", type=int, default=10)
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    cluster = start_bookkeeper(Path(tempfile.mkdtemp(prefix="icefloe-walbench-bk-")))
    results: dict[str, list[dict[str, float]]] = {wal: [] for wal in WALS}
    try:
        for round_ in range(1, args.rounds + 1):
            order = WALS if round_ % 2 else tuple(reversed(WALS))
            for wal in order:
                measures = asyncio.run(append_latencies(wal, cluster, args.appends))
                measures |= producer_run(wal, cluster, args)
                results[wal].append(measures)
                print(f"round {round_} {wal}: {json.dumps(measures)}", file=sys.stderr, flush=True)
    finally:
        cluster.discard()

    keys = list(results[WALS[0]][0])
    print(f"{'median of ' + str(args.rounds) + ' rounds':<28}{'bookkeeper':>12}{'object':>12}")
    for key in keys:
        row = [statistics.median(r[key] for r in results[wal]) for wal in WALS]
        print(f"{key:<28}" + "".join(f"{value:>12.2f}" for value in row))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
