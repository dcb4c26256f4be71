"""Compaction of a WAL backlog on Spark: local[1], local[2] and a two-worker standalone cluster.

    PYTHONPATH=. python tests/bench/spark_cluster_bench.py [--mb 2000] [--task-mb 128]

Writes about ``--mb`` MB of WAL to a topic of 8 partitions (1 KiB records, half random hex,
half repeated text, in 64-record batches, in the ``cost`` flush profile's 4 MiB WAL objects),
then, for each engine, compacts the whole backlog with ``Compactor.until_idle`` as
``icefloe compact --until-idle`` does: runs of up to ``[compactor] max_tasks_per_run`` tasks of
``--task-mb`` MiB, each run one Spark job, committed to the Iceberg and Delta tables. Between
engines the metadata store is put back as it was after the writes (the WAL objects stay:
nothing collects them meanwhile) and the tables are dropped, so each engine compacts the same
backlog from scratch.

Reported per engine: WAL MB/s (wall time of the backfill, Spark already started), tasks and
runs, tasks per executor (from the driver's Spark REST API), the bytes the driver's object
store moved against the bytes the executors' stores moved (the driver's share), and the
Parquet files' count and sizes. The cluster is the test suite's (tests/support/spark_cluster.py):
a master and two workers, each application one one-core executor per worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.ports.object_store import RequestKind, RequestStats
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record, build_batch
from icefloe.topics.registry import TopicRegistry
from tests.support.servers import free_port
from tests.support.spark_cluster import spark_cluster

RECORD_BYTES = 1024
BATCH_RECORDS = 64
PARTITIONS = 8
FILLER = b'{"event":"page_view","site":"example","path":"/products/item"}' * 8


def value() -> bytes:
    return (os.urandom(RECORD_BYTES // 4).hex().encode() + FILLER)[:RECORD_BYTES]


async def write_backlog(config: Config, total_bytes: int) -> list[int]:
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        topic = await topics.create("bench", PARTITIONS)
        pending: set[asyncio.Future[int]] = set()
        written = i = 0
        while written < total_bytes:
            records = [
                Record(n, 1_700_000_000_000 + i, f"key-{i}-{n}".encode(), value())
                for n in range(BATCH_RECORDS)
            ]
            data = build_batch(records)
            pending.add(await storage.submit_batches(topic.streams[i % PARTITIONS], data))
            written += len(data)
            i += 1
            if len(pending) >= 256:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*pending)
        await topics.close()
        return list(topic.streams)


def config_for(data_dir: Path, master: str, spark: dict[str, Any], task_mb: int) -> Config:
    return load_config(
        env={},
        overrides={
            "data_dir": str(data_dir),
            # 4 MiB WAL objects, as on S3, GCS and Azure: 512 KiB chunks of each partition.
            "storage": {"profile": "cost"},
            "table": {"formats": ["iceberg", "delta"]},
            "compactor": {"max_task_bytes": task_mb << 20, "max_tasks_per_run": 16},
            "compaction": {"backend": "spark", "spark": {**spark, "master": master}},
        },
    )


def moved(stats: RequestStats) -> int:
    return stats.bytes[RequestKind.GET] + stats.bytes[RequestKind.PUT]


def tasks_per_executor(ui_port: int) -> dict[str, int]:
    base = f"http://127.0.0.1:{ui_port}/api/v1/applications"
    with urllib.request.urlopen(base, timeout=10) as response:
        [app] = json.load(response)
    with urllib.request.urlopen(f"{base}/{app['id']}/allexecutors", timeout=10) as response:
        executors = json.load(response)
    return {e["id"]: e["totalTasks"] for e in executors if e["totalTasks"]}


async def backfill(label: str, config: Config, streams: list[int], ui_port: int) -> dict[str, Any]:
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            await compactor.engine.start()  # type: ignore[attr-defined]
            wal = sum([(await compactor.backlog(t))[1] for t in topics.cached()])
            driver_before = moved(storage.object_store.stats)
            runs = 0

            def count(_: object) -> None:
                nonlocal runs
                runs += 1

            started = time.perf_counter()
            tasks = await compactor.until_idle(count)
            seconds = time.perf_counter() - started
            sizes = [
                e.location.size
                for s in streams
                for e in await storage.index.scan(s)
                if isinstance(e.location, ParquetLocation)
            ]
            driver = moved(storage.object_store.stats) - driver_before
            executors = moved(compactor.engine.stats)
            return {
                "engine": label,
                "wal_mb": wal / 1e6,
                "seconds": seconds,
                "mb_s": wal / 1e6 / seconds,
                "tasks": tasks,
                "runs": runs,
                "per_executor": tasks_per_executor(ui_port),
                "driver_share": driver / (driver + executors),
                "driver_mb": driver / 1e6,
                "files": len(sizes),
                "file_mb": (
                    min(sizes) / 1e6,
                    statistics.median(sizes) / 1e6,
                    max(sizes) / 1e6,
                ),
                "parquet_mb": sum(sizes) / 1e6,
            }
        finally:
            await compactor.close()
            await topics.close()


def take_snapshot(data_dir: Path, snapshot: Path) -> Path:
    """A copy of the metadata store's files."""
    snapshot.mkdir()
    for name in os.listdir(data_dir):
        if name.startswith("metadata.db"):
            shutil.copy2(data_dir / name, snapshot / name)
    return snapshot


def reset(data_dir: Path, snapshot: Path) -> None:
    """The metadata store as after the writes; no tables."""
    for name in os.listdir(snapshot):
        shutil.copy2(snapshot / name, data_dir / name)
    for gone in ("objects/tables", "objects/iceberg-metadata", "iceberg-catalog.db"):
        path = data_dir / gone
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


async def main(total_mb: int, task_mb: int, engines: list[str]) -> None:
    cluster = spark_cluster() if "cluster" in engines else None
    with tempfile.TemporaryDirectory(prefix="icefloe-spark-bench-") as tmp:
        data_dir = Path(tmp, "data")
        ui_port = free_port()
        base = {
            "python": os.environ.get("PYSPARK_PYTHON") or __import__("sys").executable,
            "conf": {
                "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1",
                "spark.driver.memory": "1g",
                "spark.ui.port": str(ui_port),
                "spark.ui.showConsoleProgress": "false",
                "spark.executor.memory": "1g",
                "spark.executor.cores": "1",
                "spark.cores.max": "2",
            },
        }
        started = time.perf_counter()
        streams = await write_backlog(
            config_for(data_dir, "local[1]", base, task_mb), total_mb * 10**6
        )
        print(
            f"backlog: {total_mb} MB of WAL in {PARTITIONS} partitions, written in "
            f"{time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} CPUs"
        )
        snapshot = take_snapshot(data_dir, Path(tmp, "snapshot"))
        masters = {"local1": "local[1]", "local2": "local[2]"}
        if cluster is not None:
            masters["cluster"] = cluster.master_url
        for label in engines:
            reset(data_dir, snapshot)
            config = config_for(data_dir, masters[label], base, task_mb)
            result = await backfill(label, config, streams, ui_port)
            low, median, high = result["file_mb"]
            print(
                f"{label:<8} {result['wal_mb']:7.0f} MB in {result['seconds']:6.1f} s: "
                f"{result['mb_s']:6.1f} MB/s; {result['tasks']} tasks in {result['runs']} runs; "
                f"tasks per executor {result['per_executor']}; driver's share of bytes "
                f"{result['driver_share']:.5f} ({result['driver_mb']:.2f} MB); "
                f"{result['files']} Parquet files, {result['parquet_mb']:.0f} MB, "
                f"min/median/max {low:.1f}/{median:.1f}/{high:.1f} MB; "
                f"load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=2000, help="WAL backlog in MB")
    parser.add_argument("--task-mb", type=int, default=128, help="[compactor] max_task_bytes, MiB")
    parser.add_argument("--engines", default="local1,local2,cluster")
    args = parser.parse_args()
    asyncio.run(main(args.mb, args.task_mb, args.engines.split(",")))
