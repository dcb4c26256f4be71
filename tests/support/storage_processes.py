"""Code that runs in child processes of the storage tests (spawned, so it must be importable)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
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

        engine.metadata.append_sequence = killed  # type: ignore[method-assign]
        await engine.append(stream, tagged_records("lost", 3))

    asyncio.run(main())
