"""`icefloe tables` reports a topic's tables without creating them; the commands that work on
stored data take --data-dir and refuse a folder that holds none."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from icefloe.cli import cli
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.support.storage import storage_config


async def seed(data_dir: Path) -> None:
    async with await StreamStorage.open(storage_config(data_dir)) as storage:
        topic = await TopicRegistry(storage).create("t", 1)
        await storage.append(topic.streams[0], [Record(i, 0, None, b"v") for i in range(3)])


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


def test_tables_takes_the_data_dir_option(tmp_path: Path) -> None:
    asyncio.run(seed(tmp_path))
    rows = json.loads(run("tables", "--data-dir", str(tmp_path), "--json"))
    assert {r["topic"] for r in rows} == {"t"}


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
