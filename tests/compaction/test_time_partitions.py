"""A topic whose tables are partitioned by the hour of the record timestamp: compaction writes a
file per hour and partition, Kafka reads stay the same (batches that straddle an hour
included), both formats record each file's hour, and a reader filtering on time reads only
the matching files."""

from __future__ import annotations

import datetime

import pyarrow.dataset as ds
import pytest
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

from icefloe.ports.table import TimePartition
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.configs import REWRITE_MIN_FILES_CONFIG, TIME_PARTITION_CONFIG
from icefloe.topics.registry import Topic, TopicError
from tests.compaction.conftest import Parts
from tests.compaction.test_saga_crashes import table_rows
from tests.contract.test_table_delta import delta_table
from tests.contract.test_table_iceberg import pyiceberg_table

HOUR = TimePartition.HOUR
FIRST_HOUR = 472_000  # hours since the epoch: 2023-11-05 16:00 UTC


def at(hour: int, i: int) -> int:
    """A timestamp ``i`` ms into hour ``FIRST_HOUR + hour``."""
    return (FIRST_HOUR + hour) * HOUR.millis + i


@pytest.fixture
def parts(table_parts: Parts) -> Parts:
    """Storage, topics and a compactor with both table formats on."""
    return table_parts


async def hourly_topic(parts: Parts, **configs: str) -> Topic:
    """Two partitions; each gets 30 records over three hours in two batches that straddle the
    changes of hour."""
    storage, topics, _ = parts
    topic = await topics.create("events", 2, {TIME_PARTITION_CONFIG: "hour", **configs})
    for p, stream in enumerate(topic.streams):
        records = [Record(0, at(i // 10, i), None, f"{p}/{i}".encode()) for i in range(30)]
        await storage.append(stream, records[:15])
        await storage.append(stream, records[15:])
    return topic


async def contents(storage: StreamStorage, topic: Topic) -> list[list[tuple[int, int, bytes]]]:
    return [
        [(r.offset, r.timestamp, r.value or b"") for r in await storage.read_records(s, 0, 1 << 24)]
        for s in topic.streams
    ]


async def test_each_hour_of_each_partition_is_a_file_in_both_tables(parts: Parts) -> None:
    storage, _, compactor = parts
    topic = await hourly_topic(parts)
    before = await contents(storage, topic)

    await compactor.until_idle()

    assert await contents(storage, topic) == before  # straddling batches read back whole
    for stream in topic.streams:
        entries = await storage.index.scan(stream)
        assert [(e.start, e.end) for e in entries] == [(0, 10), (10, 20), (20, 30)]
    spec = compactor.committer.table_spec("events")
    assert spec.time_partition is HOUR
    for name, table_format in compactor.table_formats.items():
        files = await table_format.files(spec)
        assert sorted((f.partition, f.time_bucket) for f in files) == [
            (p, FIRST_HOUR + h) for p in (0, 1) for h in range(3)
        ], name
    wanted = sorted((p, i, f"{p}/{i}".encode()) for p in (0, 1) for i in range(30))
    for name, rows in (await table_rows(compactor, "events")).items():
        assert rows == wanted, name


async def test_a_query_on_one_hour_reads_only_that_hours_files(parts: Parts) -> None:
    _, _, compactor = parts
    await hourly_topic(parts)
    await compactor.until_idle()
    spec = compactor.committer.table_spec("events")
    second = datetime.datetime.fromtimestamp(at(1, 0) / 1000, datetime.UTC)
    third = datetime.datetime.fromtimestamp(at(2, 0) / 1000, datetime.UTC)

    iceberg = pyiceberg_table(compactor.table_formats["iceberg"], spec)
    in_hour = And(
        GreaterThanOrEqual("timestamp", second.isoformat()),
        LessThan("timestamp", third.isoformat()),
    )
    planned = list(iceberg.scan(row_filter=in_hour).plan_files())
    assert len(planned) == 2  # one file per partition, of the 6
    assert iceberg.scan(row_filter=in_hour).to_arrow().num_rows == 20

    delta = delta_table(spec, compactor.storage.object_store.engine_options()).to_pyarrow_dataset()
    fragments = list(delta.get_fragments(filter=ds.field(HOUR.column) == second))
    assert len(fragments) == 2
    assert delta.to_table(filter=ds.field(HOUR.column) == second).num_rows == 20


async def test_small_files_merge_only_within_their_hour(parts: Parts) -> None:
    storage, _, compactor = parts
    topic = await hourly_topic(parts, **{REWRITE_MIN_FILES_CONFIG: "2"})
    await compactor.until_idle()
    for p, stream in enumerate(topic.streams):  # five more small files in the last hour
        for n in range(5):
            await storage.append(stream, [Record(0, at(2, 100 + n), None, f"{p}/x{n}".encode())])
            await compactor.until_idle()
    before = await contents(storage, topic)

    while await compactor.rewrite_once() is not None:
        pass

    for stream in topic.streams:
        entries = await storage.index.scan(stream)
        assert [(e.start, e.end) for e in entries] == [(0, 10), (10, 20), (20, 35)]
    assert await contents(storage, topic) == before
    spec = compactor.committer.table_spec("events")
    for table_format in compactor.table_formats.values():
        buckets = sorted(f.time_bucket for f in await table_format.files(spec))
        assert buckets == [FIRST_HOUR + h for h in range(3) for _ in (0, 1)]


async def test_time_partitioning_is_fixed_when_the_topic_is_created(parts: Parts) -> None:
    _, topics, _ = parts
    await hourly_topic(parts)
    with pytest.raises(TopicError, match="set when a topic is created"):
        await topics.set_configs("events", {TIME_PARTITION_CONFIG: "day"})
    with pytest.raises(TopicError, match="set when a topic is created"):
        await topics.set_configs("events", {})
    await topics.set_configs("events", {TIME_PARTITION_CONFIG: "hour", "retention.ms": "5"})
