"""Announces the ``delta`` table format. Imports nothing heavy: the adapter is a string."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.TABLE,
            "delta",
            "icefloe_table_delta.table_format:DeltaTableFormat",
            "Delta Lake tables written by delta-rs; no server needed",
        )
    ]
