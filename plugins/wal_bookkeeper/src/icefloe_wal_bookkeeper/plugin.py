"""Announces the ``bookkeeper`` WAL backend without importing it (nor starting a JVM)."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.WAL,
            "bookkeeper",
            "icefloe_wal_bookkeeper.wal:BookKeeperWAL",
            "Apache BookKeeper: one ledger per WAL object, replicated to a quorum of bookies",
        )
    ]
