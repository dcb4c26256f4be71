"""Announces the backend. Imports nothing heavy: the adapter class is named by a string."""

from __future__ import annotations

from icefloe.plugins import hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


@hookimpl
def icefloe_register_backends() -> list[BackendSpec]:
    return [
        BackendSpec(
            PortKind.OBJECT_STORE,
            "memory",
            "icefloe_store_memory.store:MemoryObjectStore",
            "Objects in this process's memory (tests and demos only)",
        )
    ]
