"""Compaction throughput: the in-process engine against the Spark engine in local mode.

    python tests/bench/compaction_bench.py [--mb 100] [--cores 2] [--repeat 3]
        [--engines local,spark]

Writes about ``--mb`` MB of WAL through the stream storage engine (1 KiB records in 16-record
batches, uncompressed, over 8 streams, the cost flush profile), then compacts all of it:

- ``execute``: the task code in this process, one task for all streams (one core);
- ``local`` and ``spark``: the engines, each with ``--cores`` workers (worker processes, or
  ``local[N]`` threads with Python worker processes), given ``--cores`` tasks that split the
  streams between them (each task reads every WAL object once, for its own streams).

Throughput is WAL bytes compacted per second of wall time, and per core (divided by the
workers used). Each figure is the median of ``--repeat`` runs after one warm-up run, so Python
workers and Spark's JVM are warm; Spark's start-up time is reported separately. Also reported:
Parquet bytes against WAL bytes for the same records, and object-store GETs per WAL object for
one task run by ``execute`` against the store's request counters.

Arrow encodes Parquet on its own thread pool (as many threads as CPUs, or
``$OMP_NUM_THREADS``). Spark sets ``OMP_NUM_THREADS`` to ``spark.task.cpus`` (1) in its Python
workers; the in-process engine's workers inherit this process's setting. Run with
``OMP_NUM_THREADS=1`` to compare the engines at one thread per task, i.e. really per core.

Values are 1 KiB: 512 hex characters of random data (half the entropy of random bytes) and a
repeated JSON-like text, so both the WAL and Parquet (zstd) see realistic, partly compressible
payloads.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import pyarrow as pa

from icefloe.compaction.task import execute
from icefloe.config import Config, load_config
from icefloe.ports.base import PortKind
from icefloe.ports.compaction import CompactionEngine, CompactionTask, StreamRange, WrittenFile
from icefloe.ports.object_store import RequestKind
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import WalLocation
from icefloe.storage.records import Record, build_batch
from icefloe.testing.contract import open_backend

RECORD_BYTES = 1024
BATCH_RECORDS = 16
STREAMS = 8
FILLER = b'{"event":"page_view","site":"example","path":"/products/item"}' * 8


def value() -> bytes:
    random_half = os.urandom(RECORD_BYTES // 4).hex().encode()
    return (random_half + FILLER)[:RECORD_BYTES]


async def write_wal(storage: StreamStorage, total_bytes: int) -> list[int]:
    """Pipelined appends of 16 KiB batches, round-robin over the streams."""
    streams = [await storage.create_stream(f"bench-{i}") for i in range(STREAMS)]
    pending: set[asyncio.Future[int]] = set()
    written = 0
    i = 0
    while written < total_bytes:
        records = [
            Record(n, 1_700_000_000_000 + i, f"key-{i}-{n}".encode(), value())
            for n in range(BATCH_RECORDS)
        ]
        data = build_batch(records)
        pending.add(await storage.submit_batches(streams[i % STREAMS], data))
        written += len(data)
        i += 1
        if len(pending) >= 512:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*pending)
    return streams


async def make_tasks(
    storage: StreamStorage, streams: Sequence[int], count: int, tag: str
) -> list[CompactionTask]:
    """``count`` tasks splitting ``streams`` between them, as the planner builds ranges."""
    tasks = []
    for t in range(count):
        mine = streams[t::count]
        ranges = []
        for partition, stream in enumerate(mine):
            for entry in await storage.index.scan(stream):
                location = entry.location
                assert isinstance(location, WalLocation)
                ranges.append(
                    StreamRange(
                        stream,
                        partition,
                        entry.start,
                        entry.end,
                        location.ref,
                        location.position,
                        location.position + location.length,
                    )
                )
        outputs = tuple((s, f"bench/{tag}/task-{t}/stream-{s}.parquet") for s in mine)
        tasks.append(CompactionTask(f"{tag}-{t}", tuple(ranges), outputs))
    return tasks


def wal_bytes(tasks: Sequence[CompactionTask]) -> int:
    return sum(r.byte_end - r.byte_start for t in tasks for r in t.ranges)


async def timed(
    run: Callable[[], Awaitable[list[WrittenFile]]], repeat: int
) -> tuple[float, list[WrittenFile]]:
    """Median seconds of ``repeat`` runs after a warm-up run, and the last run's files."""
    files = await run()
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        files = await run()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), files


async def open_engine(
    name: str, options: dict[str, object], config: Config, storage: StreamStorage, tmp: str
) -> CompactionEngine:
    engine = await open_backend(
        PortKind.COMPACTION,
        name,
        Path(tmp),
        options,
        storage.object_store,
        wal=storage.wal,
        config=config,
    )
    assert isinstance(engine, CompactionEngine)
    return engine


def report(label: str, nbytes: int, seconds: float, cores: int) -> None:
    mbps = nbytes / seconds / 1e6
    print(
        f"{label:<34} {nbytes / 1e6:7.1f} MB WAL in {seconds:6.2f} s: "
        f"{mbps:6.1f} MB/s, {mbps / cores:6.1f} MB/s per core ({cores} core(s))"
    )


async def main(total_mb: int, cores: int, repeat: int, engines: set[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="icefloe-compaction-bench-") as tmp:
        config = load_config(env={}, overrides={"data_dir": tmp})
        async with await StreamStorage.open(config) as storage:
            streams = await write_wal(storage, total_mb * 1_000_000)
            store = storage.object_store
            [whole] = await make_tasks(storage, streams, 1, "execute")
            wal_objects = len(whole.refs())
            records = sum(r.end_offset - r.start_offset for r in whole.ranges)
            print(
                f"WAL: {wal_bytes([whole]) / 1e6:.1f} MB, {records} records of "
                f"{RECORD_BYTES} B, {len(streams)} streams, {wal_objects} WAL objects; "
                f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
                f"Arrow threads {pa.cpu_count()}, "
                f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
            )

            # The task code in this process: GETs per WAL object, and one core's throughput.
            gets = store.stats.requests[RequestKind.GET]
            files = await execute(whole, storage.wal, store)
            per_object = (store.stats.requests[RequestKind.GET] - gets) / wal_objects
            parquet = sum(f.size for f in files)
            print(
                f"object GETs per WAL object (execute, one task): {per_object:g}; "
                f"Parquet {parquet / 1e6:.1f} MB for {wal_bytes([whole]) / 1e6:.1f} MB of WAL "
                f"({parquet / wal_bytes([whole]):.2f}x)"
            )
            seconds, _ = await timed(lambda: execute(whole, storage.wal, store), repeat)
            report("execute (this process, 1 task)", wal_bytes([whole]), seconds, 1)

            if engines:
                await time_engines(config, storage, streams, tmp, cores, repeat, engines)


async def time_engines(
    config: Config,
    storage: StreamStorage,
    streams: list[int],
    tmp: str,
    cores: int,
    repeat: int,
    engines: set[str],
) -> None:
    """Time the engines (``local``, ``spark``) on the same WAL; with both, compare their
    files."""
    local_tasks = await make_tasks(storage, streams, cores, "local")
    if "local" in engines:
        local = await open_engine("local", {"workers": cores}, config, storage, tmp)
        try:
            seconds, _ = await timed(lambda: local.run(local_tasks), repeat)
        finally:
            await local.close()
        label = f"local engine ({cores} workers, {cores} tasks)"
        report(label, wal_bytes(local_tasks), seconds, cores)
    if "spark" not in engines:
        return

    spark_tasks = await make_tasks(storage, streams, cores, "spark")
    spark_options = {
        "master": f"local[{cores}]",
        "conf": {
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
        },
    }
    spark = await open_engine("spark", spark_options, config, storage, tmp)
    try:
        started = time.perf_counter()
        await spark.start()  # type: ignore[attr-defined]
        print(f"Spark start-up: {time.perf_counter() - started:.1f} s")
        seconds, spark_files = await timed(lambda: spark.run(spark_tasks), repeat)
        print(f"Spark job overhead (a trivial job): {job_overhead(spark) * 1000:.0f} ms")
    finally:
        await spark.close()
    label = f"spark engine (local[{cores}], {cores} tasks)"
    report(label, wal_bytes(spark_tasks), seconds, cores)

    # Same records, same files: the engines are interchangeable.
    local_by_stream = {
        f.stream_id: dataclasses.replace(f, task_id="", path="")
        for f in await execute_all(local_tasks, storage)
    }
    assert all(
        dataclasses.replace(f, task_id="", path="") == local_by_stream[f.stream_id]
        for f in spark_files
    ), "the Spark engine's files differ from the task code's"


def job_overhead(engine: CompactionEngine) -> float:
    """Median seconds of a one-partition job that does nothing, on the warm context."""
    context = engine.spark_context  # type: ignore[attr-defined]
    seconds = []
    for _ in range(5):
        started = time.perf_counter()
        context.parallelize([0], 1).map(abs).collect()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


async def execute_all(tasks: Sequence[CompactionTask], storage: StreamStorage) -> list[WrittenFile]:
    return [f for t in tasks for f in await execute(t, storage.wal, storage.object_store)]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=100, help="MB of WAL to write and compact")
    parser.add_argument("--cores", type=int, default=2, help="workers for each engine")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs after a warm-up")
    parser.add_argument(
        "--engines",
        default="local,spark",
        help="engines to time after the task code, comma-separated ('' for none)",
    )
    args = parser.parse_args()
    chosen = {name for name in args.engines.split(",") if name}
    asyncio.run(main(args.mb, args.cores, args.repeat, chosen))
