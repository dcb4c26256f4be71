"""`icefloe groups list|describe` on a real embedded store: members, assignments and lag."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from icefloe.cli import cli
from icefloe.groups.model import ConsumerGroup, ConsumerMember, TopicInfo
from icefloe.groups.store import CommittedOffset, GroupStore
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.topics.registry import TopicRegistry
from tests.support.storage import storage_config


async def seed(data_dir: Path) -> None:
    """Topic t (2 partitions, 5 records in partition 0) and group g with one member owning both."""
    async with await StreamStorage.open(storage_config(data_dir)) as storage:
        topic = await TopicRegistry(storage).create("t", 2)
        await storage.append(topic.streams[0], [Record(i, 0, None, b"v") for i in range(5)])
        member = ConsumerMember(
            "m1", client_id="app", assigned={topic.topic_id: frozenset({0, 1})}, member_epoch=1
        )
        group = ConsumerGroup(
            "g",
            group_epoch=1,
            assignment_epoch=1,
            members=(member,),
            topics={"t": TopicInfo(topic.topic_id, 2)},
        )
        store = GroupStore(storage.metadata)
        await store.update("g", lambda current, now: (group, None))
        await store.commit_offsets("g", {("t", 0): CommittedOffset(2, -1, None, 0)}, None)


def run(data_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(
        cli, ["groups", "--data-dir", str(data_dir), *args], obj={}, catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_list_shows_each_group_with_type_and_state(tmp_path: Path) -> None:
    asyncio.run(seed(tmp_path))
    rows = json.loads(run(tmp_path, "list", "--json"))
    assert [(r["group_id"], r["type"], r["state"]) for r in rows] == [("g", "consumer", "Stable")]


def test_describe_shows_members_assignments_and_lag(tmp_path: Path) -> None:
    asyncio.run(seed(tmp_path))
    view = json.loads(run(tmp_path, "describe", "g", "--json"))
    assert [(m["member_id"], m["assignment"]) for m in view["members"]] == [("m1", {"t": [0, 1]})]
    lag = {
        (p["topic"], p["partition"]): (p["committed"], p["log_end"], p["lag"])
        for p in view["partitions"]
    }
    assert lag == {("t", 0): (2, 5, 3), ("t", 1): (None, 0, None)}
    text = run(tmp_path, "describe", "g")
    assert "m1" in text
    assert "t:0,1" in text


def test_describe_of_an_unknown_group_is_a_one_line_error_saying_how_to_list_groups(
    tmp_path: Path,
) -> None:
    asyncio.run(seed(tmp_path))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "icefloe",
            "groups",
            "describe",
            "nope",
            "--data-dir",
            str(tmp_path),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert (result.returncode, result.stderr) == (
        2,
        "error: group 'nope' does not exist; see `icefloe groups list`\n",
    )
