"""Announces the ``gcs`` object store. Imports nothing heavy: the adapter is named by a string."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.OBJECT_STORE,
            "gcs",
            "icefloe_store_gcs.store:GCSObjectStore",
            "Google Cloud Storage (google-cloud-storage)",
        )
    ]
