"""The Oxia metadata store runs the MetadataStore contract against a real standalone Oxia."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from icefloe.testing.metadata_contract import MetadataStoreContract
from tests.support.metadata_servers import shared_oxia


class TestOxiaMetadataStore(MetadataStoreContract):
    backend_name = "oxia"
    # Oxia's shortest session timeout is 2 s (shorter ttls are raised to it).
    session_ttl: ClassVar[float] = 2.0

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return shared_oxia().oxia_options(unique)
