"""Announces the ``iceberg`` table format. Imports nothing heavy: the adapter is a string."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.TABLE,
            "iceberg",
            "icefloe_table_iceberg.table_format:IcebergTableFormat",
            "Apache Iceberg tables in a SQL (SQLite by default) or REST catalog (pyiceberg)",
        )
    ]
