"""Invariant 6 (docs/design.md), tried hard: while writers append, the compactor swaps entries and
the collector deletes with a tiny grace period, no object an index entry or a table references
is ever deleted, and every reader keeps succeeding."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from icefloe.compaction.service import Compactor
from icefloe.config import load_config
from icefloe.errors import UnavailableError
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation, WalLocation
from icefloe.storage.records import Record
from icefloe.tables import layout
from icefloe.topics.registry import TopicRegistry

RUN_SECONDS = 4.0


async def test_nothing_referenced_is_ever_collected(tmp_path: Path) -> None:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2, "commit_deadline_s": 0.1, "orphan_grace_s": 0.3},
        },
    )
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        topic = await topics.create("busy", 4)
        compactor = await Compactor.open(config, storage, topics)
        stop = time.monotonic() + RUN_SECONDS
        written: dict[int, int] = dict.fromkeys(topic.streams, 0)
        failures: list[BaseException] = []

        async def write(stream: int) -> None:
            i = 0
            while time.monotonic() < stop:
                rs = [
                    Record(j, 1_700_000_000_000, None, f"{stream}/{i}/{j}".encode())
                    for j in range(5)
                ]
                try:
                    await storage.append(stream, rs)
                except UnavailableError:
                    continue  # retriable (a commit past the tiny deadline): a client retries
                written[stream] += 5
                i += 1

        async def loop(action: str) -> None:
            while time.monotonic() < stop:
                try:
                    if action == "compact":
                        await compactor.compact_once(force=True)
                    elif action == "collect":
                        await storage.collect_orphans()
                    else:
                        for stream in topic.streams:
                            await storage.read_records(stream, 0, 1 << 16)
                except Exception as exc:  # noqa: BLE001 - any failure breaks the invariant
                    failures.append(exc)
                await asyncio.sleep(0.01)

        await asyncio.gather(
            *(write(s) for s in topic.streams), loop("compact"), loop("collect"), loop("read")
        )
        assert failures == []
        await asyncio.sleep(0.4)
        await storage.collect_orphans()

        wal_objects = {info.ref async for info in storage.wal.list()}
        for stream in topic.streams:
            entries = await storage.index.scan(stream)
            for entry in entries:
                if isinstance(entry.location, WalLocation):
                    assert entry.location.ref in wal_objects
                else:
                    assert isinstance(entry.location, ParquetLocation)
                    assert await storage.object_store.head(entry.location.key) is not None
            values: list[bytes | None] = []
            offset = 0
            while offset < await storage.log_end(stream):
                batch = await storage.read_records(stream, offset, 1 << 20)
                values.extend(r.value for r in batch)
                offset = batch[-1].offset + 1
            assert len(values) == written[stream]
        for catalog in compactor.table_formats.values():
            for f in await catalog.files(compactor.committer.table_spec("busy")):
                key = f"{layout.table_root('busy')}/{f.path}"
                assert await storage.object_store.head(key) is not None
        await compactor.close()
        await topics.close()
