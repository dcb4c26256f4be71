"""The base every contract suite shares: how a backend under test is opened."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, ClassVar

from icefloe.plugins import BackendRegistry
from icefloe.ports.base import OpenContext, Port, PortKind


class Contract:
    """Base of the ``<Port>Contract`` classes.

    An opt-in test class sets :attr:`backend_name` and, when the backend needs them, overrides
    :meth:`backend_options`. The suite opens the backend through the plugin registry exactly as
    the broker would, so the entry point and the options model are tested too.
    """

    port_kind: ClassVar[PortKind]
    backend_name: ClassVar[str]

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        """Options for one isolated instance of the backend.

        Args:
            workdir: An empty folder owned by the test (embedded backends keep files here).
            unique: A string unique to this instance: use it as a key prefix, bucket name or
                namespace so that tests sharing one server do not see each other's data.

        Returns:
            A JSON-serialisable dict, validated by the backend's options model. A second
            process opens the same instance from the same dict.
        """
        return {}

    @staticmethod
    def new_unique() -> str:
        return "t" + uuid.uuid4().hex[:12]

    async def open_backend(self, workdir: Path, options: dict[str, Any]) -> Port:
        """Open the backend under test with ``options`` (from :meth:`backend_options`)."""
        return await open_backend(self.port_kind, self.backend_name, workdir, options)


async def open_backend(
    kind: PortKind,
    name: str,
    workdir: Path,
    options: dict[str, Any],
    object_store: Any = None,
    *,
    wal: Any = None,
    config: Any = None,
) -> Port:
    """Open backend ``kind``/``name`` through the registry; usable from a child process.

    ``object_store``, ``wal`` and ``config`` fill the :class:`OpenContext` of backends that
    need them (a WAL layered on an object store, a compaction engine).
    """
    cls = BackendRegistry().get(kind, name).load()
    context = OpenContext(data_dir=workdir, object_store=object_store, wal=wal, config=config)
    return await cls.open(cls.options_model.model_validate(options), context)
