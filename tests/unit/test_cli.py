"""The `icefloe` command as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def icefloe(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "icefloe", *args], env=environment, capture_output=True, text=True
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


def test_config_check_passes_on_the_defaults() -> None:
    result = icefloe("config", "check")
    assert result.returncode == 0, result.stderr
    assert "metadata: sqlite" in result.stdout


def test_bad_configuration_is_one_line_on_stderr_and_exit_2() -> None:
    result = icefloe("config", "check", ICEFLOE_METADATA__BACKEND="etx")
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert errors == [
        "metadata: error: [metadata] backend: 'etx' is not a metadata backend; valid choices: "
        "etcd, oxia, sqlite (set in the config file or ICEFLOE_METADATA__BACKEND)"
    ]


def test_unknown_config_key_stops_any_command() -> None:
    result = icefloe("config", "show", ICEFLOE_METADTA__BACKEND="etcd")
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown config section or key 'metadta'")
    assert "Traceback" not in result.stderr


def test_contract_test_of_a_backend_not_available_yet_says_so() -> None:
    result = icefloe("contract-test", "wal", "bookkeeper")
    assert result.returncode == 2
    assert "'bookkeeper' is planned but not available yet; installed: object" in result.stderr
    assert "pip install" not in result.stderr
