"""Stream storage on the embedded default: append throughput and append latency.

    python tests/bench/storage_bench.py [--seconds 10] [--profile cost|latency]

Throughput: 1 KiB records in 16 KiB batches over 8 streams, submitted without waiting for
each commit, so several flushes are in flight (as when a broker serves many producers).
Latency: one append at a time, so each waits for its own flush and commit; p50/p99 over all
appends.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

from icefloe.config import load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record, build_batch

RECORD_BYTES = 1024
BATCH_RECORDS = 16
STREAMS = 8


def batch(value: bytes) -> bytes:
    records = [Record(i, 1_700_000_000_000, None, value) for i in range(BATCH_RECORDS)]
    return build_batch(records)


async def throughput(storage: StreamStorage, streams: list[int], seconds: float) -> float:
    """Pipelined appends, as a broker serving many producers submits them: the engine's
    ``max_buffered_bytes`` is the only limit on what is in flight."""
    data = batch(b"x" * RECORD_BYTES)
    pending: set[asyncio.Future[int]] = set()
    appended = 0
    started = time.monotonic()
    stop = started + seconds
    i = 0
    while time.monotonic() < stop:
        pending.add(await storage.submit_batches(streams[i % len(streams)], data))
        appended += len(data)
        i += 1
        if len(pending) >= 1024:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*pending)
    return appended / (time.monotonic() - started) / 1e6


async def latency(storage: StreamStorage, stream: int, seconds: float) -> list[float]:
    data = batch(b"y" * RECORD_BYTES)
    samples = []
    stop = time.monotonic() + seconds
    while time.monotonic() < stop:
        started = time.perf_counter()
        await storage.append_batches(stream, data)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100)[int(q) - 1]


async def main(seconds: float, profile: str) -> None:
    with tempfile.TemporaryDirectory(prefix="icefloe-bench-") as tmp:
        config = load_config(env={}, overrides={"data_dir": tmp, "storage": {"profile": profile}})
        async with await StreamStorage.open(config) as storage:
            streams = [await storage.create_stream(f"bench-{i}") for i in range(STREAMS)]
            mbps = await throughput(storage, streams, seconds)
            samples = await latency(storage, streams[0], seconds)
    print(
        f"profile={profile}: append throughput {mbps:.1f} MB/s "
        f"(1 KiB records, 16 KiB batches, {STREAMS} streams, pipelined)"
    )
    print(
        f"profile={profile}: sequential append latency p50 {percentile(samples, 50):.2f} ms, "
        f"p99 {percentile(samples, 99):.2f} ms over {len(samples)} appends"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--profile", choices=["cost", "latency"], default="cost")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.profile))
