"""Announces the ``s3`` object store. Imports nothing heavy: the adapter is named by a string."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.OBJECT_STORE,
            "s3",
            "icefloe_store_s3.store:S3ObjectStore",
            "Amazon S3 or an S3-compatible service (boto3)",
        )
    ]
