"""The CompactionEngine contract on the in-process engine (worker processes on this machine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from icefloe.testing.compaction_contract import CompactionEngineContract


class TestLocalCompactionEngine(CompactionEngineContract):
    backend_name = "local"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {"workers": 2}
