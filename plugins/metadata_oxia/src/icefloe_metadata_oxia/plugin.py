"""Announces the ``oxia`` metadata backend without importing it."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.METADATA,
            "oxia",
            "icefloe_metadata_oxia.store:OxiaMetadataStore",
            "Oxia: sharded metadata store with server-assigned sequence keys (clusters)",
        )
    ]
