"""The etcd metadata store runs the MetadataStore contract against a real etcd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from icefloe.testing.metadata_contract import MetadataStoreContract
from tests.support.metadata_servers import shared_etcd


class TestEtcdMetadataStore(MetadataStoreContract):
    backend_name = "etcd"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return shared_etcd().etcd_options(unique)
