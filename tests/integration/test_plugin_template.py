"""A plugin package built in the test is discovered after installation and passes its contract.

The package is docs/plugin-template (so the template stays a working plugin), renamed to a
throwaway distribution and installed with pip into a private folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "docs" / "plugin-template"


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for subprocesses that see the throwaway plugin installed."""
    work = tmp_path_factory.mktemp("plugin")
    source = work / "source"
    shutil.copytree(TEMPLATE, source)
    pyproject = source / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text().replace(
            'name = "icefloe-store-memory"', 'name = "icefloe-store-throwaway"'
        )
    )
    target = work / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(target), env.get("PYTHONPATH", "")])
    return env


def icefloe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefloe", *args], env=env, capture_output=True, text=True
    )


def test_installed_plugin_is_listed_with_its_distribution(installed_plugin: dict[str, str]) -> None:
    result = icefloe(installed_plugin, "plugins", "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["port"], r["backend"]): r for r in json.loads(result.stdout)}
    assert rows[("object_store", "memory")]["distribution"] == "icefloe-store-throwaway"
    assert rows[("object_store", "memory")]["status"] == "ok"


def test_installed_plugin_is_selectable_by_one_config_line(
    installed_plugin: dict[str, str],
) -> None:
    env = dict(installed_plugin, ICEFLOE_OBJECT_STORE__BACKEND="memory")
    result = icefloe(env, "config", "check")
    assert "object_store: memory" in result.stdout, result.stderr


def test_installed_plugin_passes_the_contract_suite(installed_plugin: dict[str, str]) -> None:
    result = icefloe(installed_plugin, "contract-test", "object_store", "memory", "--", "-q")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
