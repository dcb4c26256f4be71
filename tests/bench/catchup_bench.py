"""Catch-up reads: a consumer reading a stream from the start, from the WAL and from Parquet.

    python -m tests.bench.catchup_bench [--mb 64] [--store local|minio] [--wal-only]

Writes ``--mb`` MB of 1 KiB records (16 per batch) over 8 streams on the embedded default (or
with the object store on MinIO, started for the run: a store with a network round trip), then
reads every stream from offset 0 in 1 MiB fetches with a fresh engine (nothing cached), first
while the data is in WAL objects, then again after compaction into Parquet. Reported: MB/s of
record batches returned, and the bytes stored in each form.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record, build_batch
from icefloe.topics.registry import TopicRegistry
from tests.support.object_servers import minio_options

STREAMS = 8
FETCH_BYTES = 1 << 20


async def read_everything(config: Config, streams: list[int]) -> tuple[float, int]:
    """(seconds, bytes) to read every stream from 0 with a fresh engine."""
    async with await StreamStorage.open(config) as storage:
        started = time.perf_counter()
        total = 0
        for stream in streams:
            offset, end = 0, await storage.log_end(stream)
            while offset < end:
                result = await storage.read(stream, offset, FETCH_BYTES)
                total += len(result.data)
                offset = result.next_offset
        return time.perf_counter() - started, total


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def store_settings(store: str) -> dict[str, Any]:
    if store == "local":
        return {}
    # The latency profile (flush at 1 MiB), as on the local store: the same WAL objects.
    return {
        "object_store": {"backend": "s3", "s3": minio_options(f"catchup-{uuid.uuid4().hex}")},
        "storage": {"profile": "latency"},
    }


async def main(megabytes: int, store: str, wal_only: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="icefloe-catchup-") as tmp:
        config = load_config(
            env={},
            overrides={"data_dir": tmp, "table": {"formats": []}, **store_settings(store)},
        )
        async with await StreamStorage.open(config) as storage:
            topics = TopicRegistry(storage)
            await topics.start()
            topic = await topics.create("catchup", STREAMS)
            streams = list(topic.streams)
            pending = []
            for i in range(megabytes * (1 << 20) // (16 * 1024)):
                # 1 KiB values of 512 random hex digits: about half compressible, like text.
                values = [os.urandom(256).hex().encode() * 2 for _ in range(16)]
                records = [Record(j, 1_700_000_000_000 + i, None, v) for j, v in enumerate(values)]
                batch = build_batch(records)
                pending.append(await storage.submit_batches(streams[i % STREAMS], batch))
            await asyncio.gather(*pending)
            await topics.close()

        wal_seconds, wal_read = await read_everything(config, streams)
        print(
            f"catch-up from WAL:     {wal_read / wal_seconds / 1e6:6.1f} MB/s "
            f"({wal_read / 1e6:.0f} MB of batches)",
            flush=True,
        )
        if wal_only:
            return
        wal_stored = folder_bytes(Path(tmp, "objects", "wal"))

        async with await StreamStorage.open(config) as storage:
            topics = TopicRegistry(storage)
            await topics.start()
            compactor = await Compactor.open(config, storage, topics)
            await compactor.until_idle()
            await compactor.close()
            await topics.close()
        parquet_seconds, parquet_read = await read_everything(config, streams)
        parquet_stored = folder_bytes(Path(tmp, "objects", "tables"))

    print(
        f"catch-up from Parquet: {parquet_read / parquet_seconds / 1e6:6.1f} MB/s "
        f"({parquet_read / 1e6:.0f} MB of batches, rebuilt uncompressed)"
    )
    if store == "local":  # sizes of the files on disk
        print(
            f"stored: WAL {wal_stored / 1e6:.1f} MB, Parquet {parquet_stored / 1e6:.1f} MB "
            f"({parquet_stored / wal_stored:.2f}x)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--store", choices=("local", "minio"), default="local")
    parser.add_argument("--wal-only", action="store_true", help="skip compaction and Parquet")
    args = parser.parse_args()
    asyncio.run(main(args.mb, args.store, args.wal_only))
