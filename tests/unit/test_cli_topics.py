"""`icefloe topics` as a user runs it: straight on the configured storage, no broker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

Topics = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def topics(tmp_path: Path) -> Topics:
    """Run `icefloe topics --data-dir <fresh dir> ARGS…`."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
        environment.update(env)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "icefloe",
                "topics",
                "--data-dir",
                str(tmp_path / "data"),
                *args,
            ],
            env=environment,
            capture_output=True,
            text=True,
        )

    return run


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line.strip()]


def test_create_then_list_shows_name_partitions_and_id(topics: Topics) -> None:
    created = topics("create", "orders", "--partitions", "3")
    assert created.returncode == 0, created.stderr
    listed = topics("list")
    assert listed.returncode == 0, listed.stderr
    header, *lines = rows(listed.stdout)
    assert header == ["NAME", "PARTITIONS", "ID"]
    assert [line[:2] for line in lines] == [["orders", "3"]]
    assert lines[0][2] in created.stdout


def test_partitions_default_to_the_broker_setting(topics: Topics) -> None:
    topics("create", "orders", ICEFLOE_BROKER__DEFAULT_PARTITIONS="4")
    assert rows(topics("list").stdout)[1][:2] == ["orders", "4"]


def test_describe_shows_each_partition_with_its_stream_and_offsets(topics: Topics) -> None:
    topics("create", "orders", "-p", "2")
    described = topics("describe", "orders")
    assert described.returncode == 0, described.stderr
    lines = rows(described.stdout)
    start = lines.index(["PARTITION", "STREAM", "LOG-START", "LOG-END"])
    partitions = lines[start + 1 : start + 3]
    assert [(p[0], p[2], p[3]) for p in partitions] == [("0", "0", "0"), ("1", "0", "0")]
    assert len({p[1] for p in partitions}) == 2  # one stream each


def test_describe_shows_configs_set_at_creation_and_defaults(topics: Topics) -> None:
    topics("create", "orders", "--config", "retention.ms=1000", "-c", "cleanup.policy=compact")
    lines = rows(topics("describe", "orders").stdout)
    assert ["retention.ms", "1000", "topic"] in lines
    assert ["cleanup.policy", "compact", "topic"] in lines
    assert ["segment.ms", "604800000", "default"] in lines


def test_delete_removes_the_topic(topics: Topics) -> None:
    topics("create", "orders")
    deleted = topics("delete", "orders")
    assert deleted.returncode == 0, deleted.stderr
    assert rows(topics("list").stdout) == [["NAME", "PARTITIONS", "ID"]]


def test_creating_an_existing_topic_is_a_one_line_error(topics: Topics) -> None:
    topics("create", "orders")
    again = topics("create", "orders")
    assert again.returncode == 2
    assert again.stderr == "error: topic 'orders' already exists\n"


def test_an_unknown_config_is_a_one_line_error_naming_valid_keys(topics: Topics) -> None:
    result = topics("create", "orders", "-c", "retention.mss=1")
    assert result.returncode == 2
    assert result.stderr.startswith("error: Unknown topic config name: retention.mss;")
    assert "retention.ms" in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_bad_config_value_names_the_accepted_values(topics: Topics) -> None:
    result = topics("create", "orders", "-c", "message.timestamp.type=Now")
    assert result.returncode == 2
    assert result.stderr == (
        "error: Invalid value Now for configuration message.timestamp.type: "
        "expected one of CreateTime, LogAppendTime\n"
    )


def test_an_invalid_name_is_a_one_line_error(topics: Topics) -> None:
    result = topics("create", "no spaces")
    assert result.returncode == 2
    assert "may contain only ASCII letters" in result.stderr


def test_describing_an_unknown_topic_is_a_one_line_error(topics: Topics) -> None:
    topics("create", "other")
    result = topics("describe", "nope")
    assert (result.returncode, result.stderr) == (2, "error: topic 'nope' does not exist\n")


def test_deleting_an_unknown_topic_is_a_one_line_error(topics: Topics) -> None:
    topics("create", "other")
    result = topics("delete", "nope")
    assert (result.returncode, result.stderr) == (2, "error: topic 'nope' does not exist\n")


def test_a_malformed_config_option_is_a_usage_error(topics: Topics) -> None:
    result = topics("create", "orders", "-c", "retention.ms")
    assert result.returncode == 2
    assert "expected KEY=VALUE" in result.stderr
