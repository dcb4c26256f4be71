"""A deleted topic takes its tables along, and a topic created again under its name starts
with new, empty tables."""

from __future__ import annotations

import pytest

from icefloe.compaction.planner import plan_task
from icefloe.config.compactor import CompactorOptions
from icefloe.errors import NotFoundError
from icefloe.storage.records import Record
from icefloe.tables import layout
from tests.compaction.conftest import Parts
from tests.compaction.test_saga_crashes import table_rows


@pytest.fixture
def parts(table_parts: Parts) -> Parts:
    return table_parts


async def produce(parts: Parts, topic: str, values: list[bytes]) -> None:
    storage, topics, _ = parts
    found = await topics.get(topic)
    assert found is not None
    records = [Record(i, 1_700_000_000_000, None, v) for i, v in enumerate(values)]
    await storage.append(found.streams[0], records)


async def test_a_topic_created_again_gets_new_tables_and_compaction_goes_on(parts: Parts) -> None:
    _, topics, compactor = parts
    await topics.create("events", 1)
    await topics.create("other", 1)
    await produce(parts, "events", [b"old-1", b"old-2"])
    await compactor.until_idle()

    await topics.delete("events")
    await topics.create("events", 1)
    await produce(parts, "events", [b"new-1"])
    await produce(parts, "other", [b"other-1"])
    await compactor.until_idle()

    assert await table_rows(compactor, "events") == {
        "iceberg": [(0, 0, b"new-1")],
        "delta": [(0, 0, b"new-1")],
    }
    assert await table_rows(compactor, "other") == {
        "iceberg": [(0, 0, b"other-1")],
        "delta": [(0, 0, b"other-1")],
    }


async def test_a_deleted_topic_s_tables_are_dropped_and_its_files_deleted(parts: Parts) -> None:
    storage, topics, compactor = parts
    await topics.create("events", 1)
    await produce(parts, "events", [b"a", b"b"])
    await compactor.until_idle()

    await topics.delete("events")
    await compactor.until_idle()

    spec = compactor.committer.table_spec("events")
    for table_format in compactor.table_formats.values():
        with pytest.raises(NotFoundError):
            await table_format.last_commit(spec)
    assert [info.key async for info in storage.object_store.list(layout.table_root("events"))] == []


async def test_a_task_left_unfinished_by_a_deleted_topic_never_reaches_the_new_tables(
    parts: Parts,
) -> None:
    storage, topics, compactor = parts
    old = await topics.create("events", 1)
    await produce(parts, "events", [b"old-1", b"old-2"])
    plan = await plan_task(storage.index, topics.cached(), CompactorOptions(), 0, force=True)
    assert plan is not None
    await compactor.committer.start(plan)  # the leader dies here

    await topics.delete("events")
    await topics.create("events", 1)
    await produce(parts, "events", [b"new-1", b"new-2"])
    await compactor.until_idle()

    assert await compactor.committer.unfinished() == []
    assert await table_rows(compactor, "events") == {
        "iceberg": [(0, 0, b"new-1"), (0, 1, b"new-2")],
        "delta": [(0, 0, b"new-1"), (0, 1, b"new-2")],
    }
    root = layout.table_root("events")
    left = [i.key async for i in storage.object_store.list(root) if "/partition=" in i.key]
    new = await topics.get("events")
    assert new is not None
    assert old.streams != new.streams
    assert {key.rpartition("-s")[2] for key in left} == {f"{new.streams[0]}.parquet"}
