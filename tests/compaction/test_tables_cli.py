"""`icefloe tables` reports a topic's tables without creating them; the commands that work on
stored data take --data-dir and refuse a folder that holds none; `icefloe compact` reports its
progress and refuses to compete with a serving cluster's compaction."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from click.testing import CliRunner

from icefloe.cli import cli
from icefloe.cli.tables import _describe_table
from icefloe.errors import NotFoundError, StorageError
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.support.broker import start_icefloe
from tests.support.storage import storage_config


async def seed(data_dir: Path, partitions: int = 1) -> None:
    """A topic ``t`` with three records in each partition."""
    async with await StreamStorage.open(storage_config(data_dir)) as storage:
        topic = await TopicRegistry(storage).create("t", partitions)
        for stream in topic.streams:
            await storage.append(stream, [Record(i, 0, None, b"v") for i in range(3)])


def run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), obj={}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_tables_reports_a_table_not_yet_created_and_leaves_it_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEFLOE_DATA_DIR", str(tmp_path))
    asyncio.run(seed(tmp_path))

    rows = json.loads(run("tables", "--json"))
    assert {(r["format"], r["commit"], r["files"], r["lag_records"]) for r in rows} == {
        ("iceberg", None, None, 3),
        ("delta", None, None, 3),
    }
    assert "not created yet" in run("tables")
    assert not (tmp_path / "objects" / "tables" / "t").exists()
    assert not (tmp_path / "objects" / "iceberg-metadata" / "t").exists()

    run("compact", "--until-idle")
    rows = json.loads(run("tables", "--json"))
    assert {(r["format"], r["commit"], r["files"], r["lag_records"]) for r in rows} == {
        ("iceberg", 1, 1, 0),
        ("delta", 1, 1, 0),
    }


class _DroppedWhileRead:
    """A topic's table that the drop of its deleted topic removes after its last commit was
    read, before its files are: the manifest they are listed in is gone."""

    async def last_commit(self, spec: Any) -> int:
        return 4

    async def ensure_table(self, spec: Any) -> Any:
        return SimpleNamespace(
            identifier=spec.identifier, location=spec.location, metadata_location="m"
        )

    async def files(self, spec: Any) -> list[Any]:
        raise NotFoundError("the manifest listing the table's files is gone")


def test_tables_reports_a_table_dropped_while_it_is_read_as_missing() -> None:
    spec = SimpleNamespace(identifier="icefloe.t", location="file:///tables/t")
    row = asyncio.run(_describe_table(cast(Any, _DroppedWhileRead()), cast(Any, spec)))
    assert row == {
        "identifier": "icefloe.t",
        "location": "file:///tables/t",
        "metadata_location": None,
        "commit": None,
        "files": None,
    }


class _LogFileGoneWhileRead(_DroppedWhileRead):
    """A Delta table dropped while it is read: the log file it had just listed is gone, then
    the table is."""

    def __init__(self) -> None:
        self.reads = 0

    async def last_commit(self, spec: Any) -> int:
        self.reads += 1
        if self.reads == 1:
            raise StorageError("Kernel error: File not found: _delta_log/00000000000000000001.json")
        raise NotFoundError("the table does not exist")


def test_tables_reads_a_table_again_when_a_file_it_listed_is_gone() -> None:
    spec = SimpleNamespace(identifier="icefloe.t", location="file:///tables/t")
    table_format = _LogFileGoneWhileRead()

    row = asyncio.run(_describe_table(cast(Any, table_format), cast(Any, spec)))

    assert (row["commit"], row["files"], table_format.reads) == (None, None, 2)


class _Broken(_DroppedWhileRead):
    async def files(self, spec: Any) -> list[Any]:
        raise StorageError("the table's log does not parse")


def test_tables_reports_a_table_that_fails_twice() -> None:
    spec = SimpleNamespace(identifier="icefloe.t", location="file:///tables/t")
    with pytest.raises(StorageError, match="does not parse"):
        asyncio.run(_describe_table(cast(Any, _Broken()), cast(Any, spec)))


def test_tables_takes_the_data_dir_option(tmp_path: Path) -> None:
    asyncio.run(seed(tmp_path))
    rows = json.loads(run("tables", "--data-dir", str(tmp_path), "--json"))
    assert {r["topic"] for r in rows} == {"t"}


@pytest.mark.parametrize("group", ["topics", "groups"])
def test_a_subcommand_takes_the_data_dir_option_before_or_after_its_name(
    tmp_path: Path, group: str
) -> None:
    asyncio.run(seed(tmp_path))
    before = run(group, "--data-dir", str(tmp_path), "list")
    assert run(group, "list", "--data-dir", str(tmp_path)) == before
    assert "Usage" not in before


@pytest.mark.parametrize(
    "args",
    [("tables",), ("compact",), ("maintain",), ("topics", "list"), ("groups", "list")],
)
def test_a_command_run_where_there_is_no_data_says_so_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...]
) -> None:
    monkeypatch.delenv("ICEFLOE_DATA_DIR", raising=False)
    result = subprocess.run(
        [sys.executable, "-m", "icefloe", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"error: no Icefloe data in {tmp_path / 'icefloe-data'}: run this where `icefloe serve` "
        "keeps its data, or pass --data-dir (or set data_dir in the configuration)\n"
    )
    assert not (tmp_path / "icefloe-data").exists()


def test_compact_until_idle_reports_each_task_and_the_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(seed(tmp_path, partitions=3))
    monkeypatch.setenv("ICEFLOE_COMPACTOR__MAX_TASK_BYTES", "1")  # one stream per task

    lines = run("compact", "--until-idle", "--data-dir", str(tmp_path)).splitlines()

    # Without a terminal there is no bar: each task prints what it compacted as it ends.
    assert lines[0] == "compacting"
    assert len(lines) == 5
    for line in lines[1:4]:
        assert re.fullmatch(
            r"compacted 3 records of 1 stream: \d+ WAL bytes into \d+ Parquet bytes", line
        ), line
    assert re.fullmatch(
        r"compacted 9 records in 3 tasks: \d+ WAL bytes into \d+ Parquet bytes", lines[4]
    )


def test_compact_beside_a_serving_cluster_says_how_and_works_once_it_stops(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    running = start_icefloe(data)
    try:
        deadline = time.monotonic() + 30
        while "this broker leads compaction" not in running.log_path.read_text():
            assert time.monotonic() < deadline, "the broker never led compaction"
            time.sleep(0.1)
        for command in ("compact", "maintain"):
            result = icefloe(command, "--data-dir", str(data))
            assert result.returncode == 2
            assert result.stderr == (
                "error: a running broker leads compaction; stop `icefloe serve` first, or let it "
                "compact (it runs every [compactor] interval_s)\n"
            )
    finally:
        assert running.stop() == 0
    result = icefloe("compact", "--until-idle", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "nothing to compact"


def icefloe(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    return subprocess.run(
        [sys.executable, "-m", "icefloe", *args], env=env, capture_output=True, text=True
    )


def test_compact_takes_a_spark_master_only_with_the_spark_engine(tmp_path: Path) -> None:
    asyncio.run(seed(tmp_path))
    result = CliRunner().invoke(
        cli, ["compact", "--data-dir", str(tmp_path), "--master", "local[1]"], obj={}
    )
    assert result.exit_code == 2
    assert "--master and --spark-conf need the spark engine (--engine spark)" in result.output
    result = CliRunner().invoke(
        cli,
        ["compact", "--data-dir", str(tmp_path), "--engine", "spark", "--spark-conf", "nokey"],
        obj={},
    )
    assert result.exit_code == 2
    assert "'nokey' is not KEY=VALUE" in result.output
