"""The core's layers hold, and the check that guards them fails on an upward import.

The contracts are in pyproject.toml ([tool.importlinter]); `scripts/test` runs `lint-imports`
on every run. This test shows once that a new upward import breaks them: it copies the core,
lets the storage engine import the broker, and runs the same contracts on the copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(config: Path, python_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if python_path is not None:
        env["PYTHONPATH"] = str(python_path)
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=120,
    )


def test_the_core_keeps_its_layers() -> None:
    result = lint_imports(ROOT / "pyproject.toml")
    assert result.returncode == 0, result.stdout[-3000:]


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "core" / "src" / "icefloe", tmp_path / "src" / "icefloe")
    engine = tmp_path / "src" / "icefloe" / "storage" / "engine.py"
    engine.write_text(engine.read_text() + "\nimport icefloe.broker.server  # upward\n")
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    config = tmp_path / ".importlinter"
    config.write_text(_ini(contracts))

    result = lint_imports(config, python_path=tmp_path / "src")

    assert result.returncode == 1
    assert "icefloe.storage is not allowed to import icefloe.broker" in result.stdout
    assert "icefloe.storage.engine -> icefloe.broker.server" in result.stdout


def _ini(contracts: dict[str, object]) -> str:
    """The pyproject contracts in import-linter's INI form (for a file of its own)."""
    lines = ["[importlinter]", f"root_package = {contracts['root_package']}"]
    for i, contract in enumerate(contracts["contracts"]):  # type: ignore[attr-defined]
        lines += ["", f"[importlinter:contract:{i}]"]
        for key, value in contract.items():
            if isinstance(value, list):
                lines.append(f"{key} =")
                lines += [f"    {item}" for item in value]
            else:
                lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"
