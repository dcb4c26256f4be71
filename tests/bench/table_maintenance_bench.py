"""Files per table after a day-like run, with and without table maintenance.

    python -m tests.bench.table_maintenance_bench [--rounds 2880] [--partitions 3]
        [--records 200] [--rounds-per-maintenance 2]

A quiet topic: every round appends ``--records`` records of about 300 bytes to each partition
and compacts them, as the compactor does every ``max_age_s`` (30 s) when little data arrives;
2,880 rounds are a day. With maintenance, the rewrite loop runs every
``--rounds-per-maintenance`` rounds (every 60 s, ``maintenance_interval_s``) with the default
settings (128 MiB target, 8 files). Both formats are on, on the local store. Prints, for each
run: data files in each table and index entries, WAL bytes appended, live Parquet bytes, and
for maintenance the bytes rewritten per byte compacted (write amplification) and the wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

from icefloe.compaction.service import Compactor
from icefloe.config import load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry

EVENTS = ("view", "click", "add-to-cart", "purchase")


def value(i: int) -> bytes:
    """A JSON event of about 300 bytes, as compressible as typical event data."""
    payload = {"user": i % 9973, "event": EVENTS[i % 4], "session": os.urandom(16).hex()}
    return json.dumps({**payload, "attributes": os.urandom(64).hex()}).encode()


async def run(workdir: Path, args: argparse.Namespace, maintain: bool) -> dict[str, float]:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(workdir),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"]},
        },
    )
    started = time.perf_counter()
    compacted = rewritten = wal_bytes = 0
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            topic = await topics.create("events", args.partitions)
            for round_ in range(args.rounds):
                for stream in topic.streams:
                    records = [
                        Record(0, int(time.time() * 1000), f"k{i}".encode(), value(i))
                        for i in range(args.records)
                    ]
                    await storage.append(stream, records)
                while (progress := await compactor.compact_once(force=True)) is not None:
                    compacted += progress.parquet_bytes
                    wal_bytes += progress.source_bytes
                if maintain and (round_ + 1) % args.rounds_per_maintenance == 0:
                    while (progress := await compactor.rewrite_once()) is not None:
                        rewritten += progress.parquet_bytes
            spec = compactor.committer.table_spec("events")
            files = {
                name: len(await fmt.files(spec)) for name, fmt in compactor.table_formats.items()
            }
            entries = [e for s in topic.streams for e in await storage.index.scan(s)]
        finally:
            await compactor.close()
            await topics.close()
    return {
        **{f"{name} files": count for name, count in files.items()},
        "index entries": len(entries),
        "WAL MB": wal_bytes / 1e6,
        "Parquet MB (live)": sum(e.size for e in entries) / 1e6,
        "rewritten / compacted": rewritten / compacted if compacted else 0.0,
        "seconds": time.perf_counter() - started,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2880)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--rounds-per-maintenance", type=int, default=2)
    args = parser.parse_args()
    for maintain in (False, True):
        with tempfile.TemporaryDirectory(prefix="icefloe-maintenance-bench-") as workdir:
            figures = await run(Path(workdir), args, maintain)
        label = "with maintenance" if maintain else "without maintenance"
        print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
