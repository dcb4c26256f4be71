"""Registers the embedded backends through the same hook third-party plugins use."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.METADATA,
            "sqlite",
            "icefloe.embedded.sqlite_metadata:SqliteMetadataStore",
            "SQLite database file; shared by processes on one machine",
        ),
        BackendSpec(
            PortKind.OBJECT_STORE,
            "local",
            "icefloe.embedded.local_object_store:LocalObjectStore",
            "Local filesystem folder with atomic writes",
        ),
        BackendSpec(
            PortKind.COMPACTION,
            "local",
            "icefloe.compaction.local_engine:LocalCompactionEngine",
            "Compaction in worker processes on this machine",
        ),
        BackendSpec(
            PortKind.WAL,
            "object",
            "icefloe.embedded.object_wal:ObjectWAL",
            "WAL objects in the configured object store (cost-optimised)",
        ),
        BackendSpec(
            PortKind.WAL,
            "local",
            "icefloe.embedded.local_wal:LocalWAL",
            "WAL segment files on this machine's disk (latency-optimised)",
        ),
    ]
