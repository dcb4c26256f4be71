"""The `icefloe` command as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefloe import config as configuration
from tests.support.servers import free_port


def icefloe(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "icefloe", *args],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
    )


def test_plugins_lists_the_embedded_backends() -> None:
    result = icefloe("plugins")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["PORT", "BACKEND", "DISTRIBUTION", "VERSION"]
    listed = {tuple(line.split()[:3]) for line in lines[1:]}
    assert {
        ("metadata", "sqlite", "icefloe"),
        ("object_store", "local", "icefloe"),
        ("wal", "object", "icefloe"),
    } <= listed


def test_plugins_shows_declared_capabilities() -> None:
    result = icefloe("plugins")
    sqlite_line = next(line for line in result.stdout.splitlines() if " sqlite " in line)
    assert "multi_key_transaction" in sqlite_line


def test_config_show_prints_the_effective_configuration(tmp_path: Path) -> None:
    result = icefloe("config", "show", ICEFLOE_METADATA__SQLITE__POLL_INTERVAL="0.5")
    assert result.returncode == 0, result.stderr
    assert '[metadata]\nbackend = "sqlite"' in result.stdout
    assert "poll_interval = 0.5" in result.stdout


def test_config_check_reaches_every_embedded_backend_and_creates_no_data_folder(
    tmp_path: Path,
) -> None:
    result = icefloe("config", "check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"data_dir: {tmp_path / 'icefloe-data'} does not exist yet")
    for backend in ("metadata: sqlite", "object_store: local", "wal: local", "table: iceberg"):
        assert any(line.startswith(f"{backend} — reachable (") for line in lines), lines
    assert "compaction: local (not started by the check)" in lines
    assert not (tmp_path / "icefloe-data").exists()


def test_config_check_reports_a_closed_port_as_unreachable_and_exits_2(tmp_path: Path) -> None:
    closed = free_port()
    result = icefloe(
        "config",
        "check",
        "--data-dir",
        str(tmp_path),
        "--timeout",
        "5",
        ICEFLOE_METADATA__BACKEND="etcd",
        ICEFLOE_METADATA__ETCD__ENDPOINTS=f'["127.0.0.1:{closed}"]',
        ICEFLOE_TABLE__FORMATS="[]",
    )
    assert result.returncode == 2
    [line] = [line for line in result.stdout.splitlines() if line.startswith("metadata:")]
    assert line.startswith("metadata: etcd — unreachable: ")
    assert "Connection refused" in line or "no answer within 5 s" in line
    assert any(
        line.startswith("object_store: local — reachable (") for line in result.stdout.splitlines()
    )
    assert result.stderr == "error: unreachable: metadata (etcd)\n"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def test_config_check_gives_up_on_a_silent_backend_after_the_timeout(silent_port: int) -> None:
    started = time.monotonic()
    result = icefloe(
        "config",
        "check",
        "--timeout",
        "1",
        ICEFLOE_OBJECT_STORE__BACKEND="s3",
        ICEFLOE_OBJECT_STORE__S3__BUCKET="icefloe",
        ICEFLOE_OBJECT_STORE__S3__REGION="us-east-1",
        ICEFLOE_OBJECT_STORE__S3__ENDPOINT_URL=f"http://127.0.0.1:{silent_port}",
        ICEFLOE_OBJECT_STORE__S3__ACCESS_KEY_ID="key",
        ICEFLOE_OBJECT_STORE__S3__SECRET_ACCESS_KEY="secret",
        ICEFLOE_TABLE__FORMATS="[]",
    )
    # boto3 would wait 60 s per read (read_timeout) and retry: the check does not wait for it.
    assert time.monotonic() - started < 30
    assert result.returncode == 2
    lines = result.stdout.splitlines()
    assert "object_store: s3 — unreachable: no answer within 1 s" in lines
    assert "wal: object — not checked: the object store (s3) is unreachable" in lines
    assert result.stderr == "error: unreachable: object_store (s3)\n"


def test_bad_configuration_is_one_line_on_stderr_and_exit_2() -> None:
    result = icefloe("config", "check", ICEFLOE_METADATA__BACKEND="etx")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr == (
        "error: metadata: environment variable ICEFLOE_METADATA__BACKEND: [metadata] backend: "
        "'etx' is not a metadata backend; valid: etcd, oxia, sqlite\n"
    )


def test_unknown_config_key_stops_any_command() -> None:
    result = icefloe("config", "show", ICEFLOE_METADTA__BACKEND="etcd")
    assert result.returncode == 2
    assert result.stderr == (
        "error: environment variable ICEFLOE_METADTA__BACKEND: unknown config section or key "
        "'metadta'; did you mean 'metadata'? valid: "
        + ", ".join(configuration.Config.model_fields)
        + "\n"
    )


def test_contract_test_of_an_unknown_backend_lists_the_installed_ones() -> None:
    result = icefloe("contract-test", "wal", "bookkeper")
    assert result.returncode == 2
    assert "valid choices: bookkeeper, local, object" in result.stderr
