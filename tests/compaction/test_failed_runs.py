"""A run that cannot commit stops nothing else: the topics it could commit go on, its own
partitions wait, the other partitions of its topic and every other topic keep reaching the
tables; after three failures in a row it is set aside (a metric, an `icefloe tables` line)
and `icefloe tables retry` tries it again, which then leaves every record in each table once,
though a later run of its topic overtook its commit sequence meanwhile. A run that fails
because a store is out of reach, or on a lost race, is never set aside: it goes on once that
has passed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from icefloe import metrics
from icefloe.cli import cli
from icefloe.compaction.committer import SET_ASIDE_AFTER
from icefloe.errors import ConflictError, UnavailableError
from icefloe.ports.table import DataFile, TableSpec
from tests.compaction.conftest import Parts
from tests.compaction.test_saga_crashes import records, table_rows
from tests.support.tables_cli import tables_json


async def test_a_run_that_cannot_commit_is_set_aside_and_stops_nothing_else(
    table_parts: Parts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, topics, compactor = table_parts
    bad = await topics.create("bad", 2)
    good = await topics.create("good", 1)
    delta = compactor.table_formats["delta"]
    commit = delta.commit

    async def refusing(
        spec: TableSpec,
        sequence: int,
        added: list[DataFile],
        removed: list[str] = (),  # type: ignore[assignment]
    ) -> Any:
        if any(f.partition == 0 for f in added) and spec.identifier.endswith("bad"):
            raise ValueError("bad-0 refused")  # after Iceberg took the same commit
        return await commit(spec, sequence, added, list(removed))

    monkeypatch.setattr(delta, "commit", refusing)
    for stream in (bad.streams[0], good.streams[0]):
        await storage.append(stream, records(3, "a"))

    await compactor.compact_once(force=True)  # one run of both topics

    rows = await table_rows(compactor, "good")
    assert rows["delta"] == rows["iceberg"] == [(0, i, f"a/{i}".encode()) for i in range(3)]
    (part,) = await compactor.committer.unfinished()  # bad's share, split off the run
    assert part.topics == ["bad"]
    assert part.failures == 1
    assert "bad-0 refused" in str(part.error)

    for round_ in range(SET_ASIDE_AFTER - 1):
        await storage.append(good.streams[0], records(2, f"g{round_}", first=3 + 2 * round_))
        await compactor.compact_once(force=True)
    (part,) = await compactor.committer.unfinished()
    assert part.failures == SET_ASIDE_AFTER
    assert part.retry_after_ms > 0
    assert metrics.COMPACTION_RUNS_SET_ASIDE.labels("bad")._value.get() == 1
    (row, *_) = [r for r in await asyncio.to_thread(tables_json, tmp_path) if r["topic"] == "bad"]
    (aside,) = row["set_aside"]
    assert aside["partitions"] == [0]
    assert "bad-0 refused" in aside["error"]

    # Set aside: its partition waits, the topic's records in the other one go on, with the
    # topic's next commit sequence.
    await storage.append(bad.streams[1], records(2, "b"))
    await storage.append(good.streams[0], records(1, "g", first=7))
    await compactor.compact_once(force=True)
    (still,) = await compactor.committer.unfinished()
    assert still.key == part.key
    assert still.failures == SET_ASIDE_AFTER
    assert len((await table_rows(compactor, "good"))["delta"]) == 8
    assert (await storage.index.scan(bad.streams[1]))[-1].in_wal is False  # compacted

    monkeypatch.setattr(delta, "commit", commit)  # what failed is fixed
    env = {"ICEFLOE_DATA_DIR": str(tmp_path), "ICEFLOE_TABLE__FORMATS": '["iceberg","delta"]'}
    runner = CliRunner()
    retried = await asyncio.to_thread(runner.invoke, cli, ["tables", "retry"], obj={}, env=env)
    assert retried.exit_code == 0, retried.output
    assert "tried again" in retried.stdout
    await compactor.compact_once(force=True)

    assert await compactor.committer.unfinished() == []
    set_aside = metrics.COMPACTION_RUNS_SET_ASIDE.collect()[0].samples
    assert not [s for s in set_aside if s.labels and s.value]  # none set aside, in any topic
    rows = await table_rows(compactor, "bad")
    expected = [(0, i, f"a/{i}".encode()) for i in range(3)] + [(1, 0, b"b/0"), (1, 1, b"b/1")]
    assert rows["iceberg"] == rows["delta"] == sorted(expected)  # each record once, in both
    for stream in bad.streams:
        assert all(not e.in_wal for e in await storage.index.scan(stream))


@pytest.mark.parametrize(
    "passing",
    [
        UnavailableError("S3 put: cannot reach the service"),
        ConflictError("Delta table: concurrent commit, retry"),
    ],
    ids=["store-out-of-reach", "lost-race"],
)
async def test_a_run_failing_on_what_passes_by_itself_is_never_set_aside(
    table_parts: Parts, monkeypatch: pytest.MonkeyPatch, passing: Exception
) -> None:
    storage, topics, compactor = table_parts
    topic = await topics.create("events", 1)
    delta = compactor.table_formats["delta"]
    commit = delta.commit
    outage = True

    async def unreachable(
        spec: TableSpec,
        sequence: int,
        added: list[DataFile],
        removed: list[str] = (),  # type: ignore[assignment]
    ) -> Any:
        if outage:
            raise passing
        return await commit(spec, sequence, added, list(removed))

    monkeypatch.setattr(delta, "commit", unreachable)
    await storage.append(topic.streams[0], records(3, "a"))
    for _ in range(SET_ASIDE_AFTER + 2):
        await compactor.compact_once(force=True)
    (run,) = await compactor.committer.unfinished()
    assert run.failures == SET_ASIDE_AFTER + 2
    assert run.retry_after_ms == 0  # not set aside: tried again every round
    assert metrics.COMPACTION_RUNS_SET_ASIDE.labels("events")._value.get() == 0

    outage = False  # the store is back
    await compactor.compact_once(force=True)
    assert await compactor.committer.unfinished() == []
    rows = await table_rows(compactor, "events")
    assert rows["iceberg"] == rows["delta"] == [(0, i, f"a/{i}".encode()) for i in range(3)]
