"""A WAL flush of eight streams' appends, in-process on the embedded backends.

Each round appends one 60-record batch of 1 KB values to each of eight streams at once (about
what a produce request of the side-by-side's Java producer carries) and waits for the commits:
one WAL object, one group commit of eight index entries. What it times is the storage engine's
own work per flush (buffering, encoding, the producer-facing futures, the index appends), the
part of a produce request the broker's CPU goes to besides the Kafka protocol. Run with::

    .venv/bin/pytest tests/bench/test_bench_flush.py --benchmark-enable \\
        --benchmark-columns=mean,median,rounds
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pytest_benchmark.fixture import BenchmarkFixture

from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record, build_batch
from tests.support.storage import storage_config

STREAMS = 8
RECORDS_PER_BATCH = 60


def test_a_flush_of_eight_streams_appends(benchmark: BenchmarkFixture, tmp_path: Path) -> None:
    batch = build_batch(
        [Record(i, 1_700_000_000_000, b"k", bytes(1000)) for i in range(RECORDS_PER_BATCH)]
    )
    with asyncio.Runner() as runner:
        storage = runner.run(StreamStorage.open(storage_config(tmp_path)))
        try:
            streams = [runner.run(storage.create_stream(f"s{i}")) for i in range(STREAMS)]

            async def one_round() -> list[int]:
                return await asyncio.gather(*(storage.append_batches(s, batch) for s in streams))

            assert runner.run(one_round()) == [0] * STREAMS
            offsets = benchmark(lambda: runner.run(one_round()))
            # Every stream got every round's batch, after the first round's.
            assert len(set(offsets)) == 1
            assert offsets[0] > 0
            assert offsets[0] % RECORDS_PER_BATCH == 0
        finally:
            runner.run(storage.close())
