"""`icefloe tables --json` on a cluster's data folder, run in the test's process.

Tests poll it until compaction has caught up. Run as a new process, each poll would import
Icefloe and the table formats afresh, about 3 s of CPU; the command itself, run through
click's test runner, takes a fraction of that. `tests/integration/test_quickstart.py` runs
it as a user does, in a process of its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from icefloe.cli import cli


def tables_json(data_dir: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The rows `icefloe tables --json` prints for ``data_dir``, configured by ``env`` alone
    (the ``ICEFLOE_*`` variables of the test's own environment are hidden from it)."""
    hidden: dict[str, str | None] = {k: None for k in os.environ if k.startswith("ICEFLOE_")}
    environment = {**hidden, **(env or {}), "ICEFLOE_DATA_DIR": str(data_dir)}
    result = CliRunner().invoke(cli, ["tables", "--json"], obj={}, env=environment)
    assert result.exit_code == 0, (
        f"icefloe tables --json: exit {result.exit_code}\n{result.output}{result.exception!r}"
    )
    rows: list[dict[str, Any]] = json.loads(result.stdout)
    return rows
