"""Code that runs in child processes of the storage tests (spawned, so it must be importable)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record, build_batch
from tests.support.storage import storage_config


def tagged_records(tag: str, count: int) -> list[Record]:
    return [
        Record(i, 1_700_000_000_000 + i, tag.encode(), f"{tag}/{i}".encode()) for i in range(count)
    ]


def append_from_process(
    data_dir: str, stream: int, tag: str, writers: int, appends: int, total: int
) -> dict[str, Any]:
    """Append from ``writers`` tasks, then wait until ``total`` records exist and read them all."""

    async def main() -> dict[str, Any]:
        async with await StreamStorage.open(storage_config(Path(data_dir))) as storage:

            async def writer(w: int) -> list[tuple[int, int, str]]:
                done = []
                for i in range(appends):
                    name = f"{tag}-{w}-{i}"
                    count = 1 + (i % 3)
                    first = await storage.append(stream, tagged_records(name, count))
                    done.append((first, count, name))
                return done

            results = await asyncio.gather(*(writer(w) for w in range(writers)))
            deadline = time.monotonic() + 60
            while await storage.log_end(stream) < total and time.monotonic() < deadline:
                await storage.wait_for_data([(stream, total - 1)], max_wait=1)
            seen = []
            offset = 0
            while offset < total:
                batch = await storage.read_records(stream, offset)
                seen.extend((r.offset, r.value) for r in batch)
                offset = batch[-1].offset + 1
            return {"appends": [a for r in results for a in r], "seen": seen}

    return asyncio.run(main())


def append_then_die_before_commit(data_dir: str, stream: int, **storage: Any) -> None:
    """Write one WAL object, then get killed (SIGKILL) before the index append."""

    async def main() -> None:
        engine = await StreamStorage.open(storage_config(Path(data_dir), **storage))

        async def killed(*args: object, **kwargs: object) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        engine.metadata.append_sequences = killed  # type: ignore[method-assign]
        await engine.append(stream, tagged_records("lost", 3))

    asyncio.run(main())


def append_idempotent_then_die(
    data_dir: str, stream: int, producer_id: int, batches: int, **storage: Any
) -> None:
    """Append ``batches`` three-record batches of an idempotent producer, then get killed
    (SIGKILL): the producer's lease is neither renewed nor released."""

    async def main() -> None:
        engine = await StreamStorage.open(storage_config(Path(data_dir), **storage))
        for n in range(batches):
            await engine.append_batches(stream, idempotent_batch(producer_id, 0, 3 * n))
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())


def idempotent_batch(producer_id: int, epoch: int, sequence: int, count: int = 3) -> bytes:
    """A batch of ``count`` records valued ``seq<n>`` from an idempotent producer."""
    rs = [Record(i, 1_700_000_000_000, b"k", f"seq{sequence + i}".encode()) for i in range(count)]
    return build_batch(rs, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence)
