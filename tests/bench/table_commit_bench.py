"""Table commit latency per format on each object-store server.

    python -m tests.bench.table_commit_bench [--commits 20] [--servers local,moto,minio,...]

For each server (``local``, ``moto``, ``minio``, ``fake-gcs-server``, ``azurite``) and each
table format, creates a fresh table and times ``--commits`` commits of one new 1,000-row
Parquet file each — what the compactor sends per run and partition — after one warm-up
commit. Prints median and p90 milliseconds. The Parquet files are written before the clock
starts, so only the format's own work is timed: reading the file's footer (Delta), writing
manifests and metadata (Iceberg), the catalog update, and the log entry (Delta).

Emulators answer in microseconds where a cloud store takes milliseconds, so the figures
compare the formats' own costs and the number of requests each makes, not cloud latency.
Delta does not run on fake-gcs-server (see docs/tables.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import DataFile, TableFormat
from icefloe.table_names import TableName
from icefloe.tables import layout
from icefloe.testing.contract import open_backend
from icefloe.testing.table_contract import make_rows, parquet_bytes
from tests.support.object_servers import SERVERS

SERVERS_IN_ORDER = ("local", "moto", "minio", "fake-gcs-server", "azurite")
ROWS_PER_FILE = 1_000


async def open_store(server: str, workdir: Path) -> ObjectStore:
    if server == "local":
        options = {"root": str(workdir / "objects")}
        store = await open_backend(PortKind.OBJECT_STORE, "local", workdir, options)
    else:
        backend, options_of = SERVERS[server]
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        store = await open_backend(PortKind.OBJECT_STORE, backend, workdir, options_of(prefix))
    assert isinstance(store, ObjectStore)
    return store


async def time_commits(server: str, fmt: str, commits: int, workdir: Path) -> list[float]:
    store = await open_store(server, workdir)
    table_format = await open_backend(PortKind.TABLE, fmt, workdir, {}, object_store=store)
    assert isinstance(table_format, TableFormat)
    try:
        topic = f"t{uuid.uuid4().hex[:8]}"
        spec = layout.table_spec(store, TableName("bench", topic), topic)
        await table_format.ensure_table(spec)
        files = []
        for n in range(commits + 1):
            offsets = range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE)
            key = layout.data_file(topic, 0, f"{n:06d}.parquet")
            info = await store.put(key, parquet_bytes(make_rows(0, offsets)))
            path = layout.relative_path(topic, key)
            files.append(DataFile(path, info.size, ROWS_PER_FILE, 0, int(info.modified * 1000)))
        await table_format.commit(spec, 1, [files[0]])  # warm-up: catalog and clients
        timings = []
        for sequence, data_file in enumerate(files[1:], start=2):
            start = time.perf_counter()
            await table_format.commit(spec, sequence, [data_file])
            timings.append((time.perf_counter() - start) * 1000)
        return timings
    finally:
        await table_format.close()
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=20)
    parser.add_argument("--servers", default=",".join(SERVERS_IN_ORDER))
    args = parser.parse_args()
    print(f"{'server':<16} {'format':<8} {'median ms':>10} {'p90 ms':>8}")
    for server in args.servers.split(","):
        for fmt in ("iceberg", "delta"):
            if server == "fake-gcs-server" and fmt == "delta":
                print(f"{server:<16} {fmt:<8} {'—':>10} {'—':>8}  (emulator gap)")
                continue
            with tempfile.TemporaryDirectory() as workdir:
                timings = asyncio.run(time_commits(server, fmt, args.commits, Path(workdir)))
            p90 = statistics.quantiles(timings, n=10)[-1]
            print(f"{server:<16} {fmt:<8} {statistics.median(timings):>10.1f} {p90:>8.1f}")


if __name__ == "__main__":
    main()
