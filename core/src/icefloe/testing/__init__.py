"""Contract suites for Icefloe's ports, shipped so that plugin authors can run them.

A backend opts in with a small test class::

    from icefloe.testing.metadata_contract import MetadataStoreContract

    class TestMyMetadataStore(MetadataStoreContract):
        backend_name = "mine"

        def backend_options(self, workdir, unique):
            return {"address": "127.0.0.1:1234", "namespace": unique}

or, with no code at all, ``icefloe contract-test metadata mine --option address=…``.
Requires ``pip install 'icefloe[testing]'``.
"""

from __future__ import annotations

from typing import Final

from icefloe.ports.base import PortKind

CONTRACTS: Final[dict[PortKind, str]] = {
    PortKind.METADATA: "icefloe.testing.metadata_contract:MetadataStoreContract",
    PortKind.OBJECT_STORE: "icefloe.testing.object_store_contract:ObjectStoreContract",
    PortKind.WAL: "icefloe.testing.wal_contract:WALContract",
    PortKind.COMPACTION: "icefloe.testing.compaction_contract:CompactionEngineContract",
    PortKind.TABLE: "icefloe.testing.table_contract:TableFormatContract",
}
"""The contract suite of each port, as ``"module:Class"`` (imported only when run)."""
