"""Compaction throughput of a schema-backed topic: Avro records of 20 fields into typed columns.

    OMP_NUM_THREADS=1 python tests/bench/typed_compaction_bench.py [--records 200000]
        [--codec none|zstd|lz4] [--repeat 3]

Registers one Avro schema of 20 fields (ints, longs, doubles, strings, a boolean, an enum, a
timestamp, a decimal, a nested record of three fields, an array of strings, an optional
string) in the registry's store, writes ``--records`` records in the Confluent wire format
through the stream storage engine (100-record batches, compressed with ``--codec`` as a
producer would, over 4 streams), then runs the compaction task code in this process on all of
it, twice: as a raw topic (bytes only) and as a schema-backed one (``value_fields`` decoded
too, schemas found through the registry's store). One task, one process: with
``OMP_NUM_THREADS=1`` (one Arrow thread), the figures are per core.

Each time is the median of ``--repeat`` runs after a warm-up run. Also printed: WAL bytes,
and the Parquet bytes of both runs for the same records.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import decimal
import io
import json
import os
import random
import statistics
import tempfile
import time

import fastavro
import pyarrow as pa

from icefloe.compaction.task import execute
from icefloe.config import load_config
from icefloe.ports.compaction import CompactionTask, StreamRange
from icefloe.schemas.lookup import StoreLookup
from icefloe.schemas.model import SchemaType
from icefloe.schemas.store import SchemaStore
from icefloe.storage.batch import Compression
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import WalLocation
from icefloe.storage.records import Record, build_batch

STREAMS = 4
BATCH_RECORDS = 100
SCHEMA = {
    "type": "record",
    "name": "PageView",
    "namespace": "bench",
    "fields": [
        {"name": "event_id", "type": "long"},
        {"name": "user_id", "type": "long"},
        {"name": "session", "type": "string"},
        {"name": "page", "type": "string"},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "country", "type": "string"},
        {"name": "device", "type": {
            "type": "enum", "name": "Device", "symbols": ["WEB", "IOS", "ANDROID"],
        }},
        {"name": "duration_ms", "type": "int"},
        {"name": "scroll", "type": "double"},
        {"name": "price", "type": {
            "type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2,
        }},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "logged_in", "type": "boolean"},
        {"name": "items", "type": "int"},
        {"name": "ab_bucket", "type": "int"},
        {"name": "latency", "type": "double"},
        {"name": "agent", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [
            {"name": "lat", "type": "double"},
            {"name": "lon", "type": "double"},
            {"name": "city", "type": "string"},
        ]}},
        {"name": "campaign", "type": ["null", "string"], "default": None},
        {"name": "score", "type": "long"},
    ],
}  # fmt: skip
COUNTRIES = ["NO", "SE", "DE", "FR", "US", "BR", "JP", "IN"]
CITIES = ["Oslo", "Berlin", "Paris", "Austin", "Recife", "Osaka", "Pune"]
PAGES = [f"/products/{i}" for i in range(200)]
AT = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def page_view(i: int, rng: random.Random) -> dict[str, object]:
    return {
        "event_id": i,
        "user_id": rng.randrange(1_000_000),
        "session": f"{rng.getrandbits(64):016x}",
        "page": rng.choice(PAGES),
        "referrer": None if i % 3 else rng.choice(PAGES),
        "country": rng.choice(COUNTRIES),
        "device": rng.choice(["WEB", "IOS", "ANDROID"]),
        "duration_ms": rng.randrange(60_000),
        "scroll": rng.random(),
        "price": decimal.Decimal(rng.randrange(100_000)) / 100,
        "at": AT + datetime.timedelta(milliseconds=i),
        "logged_in": bool(i % 2),
        "items": rng.randrange(10),
        "ab_bucket": i % 4,
        "latency": rng.random() * 100,
        "agent": "Mozilla/5.0 (X11; Linux x86_64) Example/1.0",
        "tags": [rng.choice(["a", "b", "c", "d"]) for _ in range(rng.randrange(4))],
        "geo": {
            "lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180), "city": rng.choice(CITIES),
        },
        "campaign": None if i % 5 else f"spring-{i % 7}",
        "score": rng.randrange(1 << 40),
    }  # fmt: skip


async def fill(
    storage: StreamStorage, schema_id: int, records: int, codec: Compression
) -> list[int]:
    parsed = fastavro.parse_schema(SCHEMA)
    header = b"\x00" + schema_id.to_bytes(4, "big")
    rng = random.Random(7)
    streams = [await storage.create_stream(f"bench-{i}") for i in range(STREAMS)]
    pending = set()
    for start in range(0, records, BATCH_RECORDS):
        batch = []
        for n in range(BATCH_RECORDS):
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed, page_view(start + n, rng))
            batch.append(Record(n, 1_700_000_000_000 + start + n, None, header + out.getvalue()))
        data = build_batch(batch, compression=codec)
        stream = streams[(start // BATCH_RECORDS) % STREAMS]
        pending.add(await storage.submit_batches(stream, data))
        if len(pending) >= 256:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*pending)
    return streams


async def task_of(storage: StreamStorage, streams: list[int], typed: bool) -> CompactionTask:
    ranges = []
    for partition, stream in enumerate(streams):
        for entry in await storage.index.scan(stream):
            location = entry.location
            assert isinstance(location, WalLocation)
            end = location.position + location.length
            ranges.append(
                StreamRange(
                    stream, partition, entry.start, entry.end, location.ref, location.position, end
                )
            )
    tag = "typed" if typed else "raw"
    outputs = tuple((s, f"bench/{tag}/stream-{s}.parquet") for s in streams)
    sides = tuple((s, "bench", ("value",)) for s in streams) if typed else ()
    return CompactionTask(tag, tuple(ranges), outputs, typed=sides)


async def main(records: int, codec: str, repeat: int) -> None:
    with tempfile.TemporaryDirectory(prefix="icefloe-typed-bench-") as tmp:
        config = load_config(env={}, overrides={"data_dir": tmp})
        async with await StreamStorage.open(config) as storage:
            text = json.dumps(SCHEMA)
            schema_id = await SchemaStore(storage.metadata).claim(
                "bench", SchemaType.AVRO, text, ()
            )
            streams = await fill(storage, schema_id, records, Compression[codec.upper()])
            lookup = StoreLookup(storage.metadata)
            raw, typed = (
                await task_of(storage, streams, False),
                await task_of(storage, streams, True),
            )
            wal = sum(r.byte_end - r.byte_start for r in raw.ranges)
            print(
                f"{records} Avro records of {len(SCHEMA['fields'])} fields (producer codec "
                f"{codec}), WAL {wal / 1e6:.1f} MB over {STREAMS} streams; load average "
                f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
                f"Arrow threads {pa.cpu_count()}"
            )
            for task in (raw, typed):
                files = await execute(task, storage.wal, storage.object_store, lookup)  # warm-up
                seconds = []
                for _ in range(repeat):
                    started = time.perf_counter()
                    await execute(task, storage.wal, storage.object_store, lookup)
                    seconds.append(time.perf_counter() - started)
                median = statistics.median(seconds)
                parquet = sum(f.size for f in files)
                print(
                    f"{task.task_id:<5}: {median:6.2f} s, {records / median:9,.0f} records/s, "
                    f"{wal / median / 1e6:5.1f} MB/s of WAL; Parquet {parquet / 1e6:.1f} MB "
                    f"({parquet / wal:.2f}x the WAL)"
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument(
        "--codec", default="none", choices=["none", "zstd", "lz4", "gzip", "snappy"]
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.records, args.codec, args.repeat))
