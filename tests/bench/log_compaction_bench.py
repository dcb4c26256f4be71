"""Rows per second log compaction cleans: a partition of N keys updated M times.

    python -m tests.bench.log_compaction_bench [--keys 100000] [--updates 10]
        [--files 10] [--tables]

One partition of a ``cleanup.policy=compact`` topic gets ``--updates`` rounds of one update of
each of ``--keys`` keys (records of about 100 bytes, keys of 10), spread over ``--files``
data files (compacted from the WAL first, not timed). Then one cleaning is timed: the key map
from every file (all dirty), every file rewritten with the latest record of each key. Prints
rows in and out, seconds, rows per second in, and the process's peak memory. With
``--tables`` both table formats commit the cleaned files too (included in the time); without,
none is enabled. Embedded defaults, local store, the in-process engine (one worker process).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
from pathlib import Path

from icefloe.compaction.service import Compactor
from icefloe.config import load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry

BATCH = 1000


async def run(workdir: Path, args: argparse.Namespace) -> dict[str, float]:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(workdir),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"] if args.tables else []},
        },
    )
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            topic = await topics.create("state", 1, {"cleanup.policy": "compact"})
            stream = topic.streams[0]
            total = args.keys * args.updates
            per_file = -(-total // args.files)
            now = int(time.time() * 1000) - 60_000
            written = 0
            for update in range(args.updates):
                for first in range(0, args.keys, BATCH):
                    records = [
                        Record(0, now, b"key-%06d" % k, b"update %03d " % update + b"x" * 88)
                        for k in range(first, min(first + BATCH, args.keys))
                    ]
                    await storage.append(stream, records)
                    written += len(records)
                    if written % per_file == 0 or written == total:
                        await compactor.until_idle()
            files = len(await storage.index.scan(stream))
            started = time.perf_counter()
            progress = await compactor.clean_once(force=True)
            seconds = time.perf_counter() - started
            assert progress is not None
            kept = sum(1 for _ in await _all(storage, stream))
        finally:
            await compactor.close()
            await topics.close()
    return {
        "keys": args.keys,
        "updates": args.updates,
        "files": files,
        "rows_in": total,
        "rows_out": kept,
        "seconds": round(seconds, 3),
        "rows_per_s": round(total / seconds),
        "peak_rss_mib_this_process": round(
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ),
        "peak_rss_mib_worker": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024),
    }


async def _all(storage: StreamStorage, stream: int) -> list[Record]:
    records: list[Record] = []
    offset = 0
    end = await storage.log_end(stream)
    while offset < end:
        result = await storage.read(stream, offset, 1 << 24)
        records += await storage.read_records(stream, offset, 1 << 24)
        offset = result.next_offset
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--tables", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        print(json.dumps(asyncio.run(run(Path(workdir), args))))


if __name__ == "__main__":
    main()
