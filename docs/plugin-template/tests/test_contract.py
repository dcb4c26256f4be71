"""Opt in to the shared contract suite: the whole test file a plugin needs.

Equivalent without code: `icefloe contract-test object_store memory`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from icefloe.testing.object_store_contract import ObjectStoreContract


class TestMemoryObjectStore(ObjectStoreContract):
    backend_name = "memory"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return {}
