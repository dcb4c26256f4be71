"""Announces the ``etcd`` metadata backend without importing it."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.METADATA,
            "etcd",
            "icefloe_metadata_etcd.store:EtcdMetadataStore",
            "etcd v3: metadata in an etcd cluster, with multi-key transactions",
        )
    ]
