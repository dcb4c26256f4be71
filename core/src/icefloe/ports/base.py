"""What all ports share: their kind, capabilities, options and lifecycle."""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict

from icefloe.errors import CapabilityError

if TYPE_CHECKING:
    from icefloe.ports.object_store import ObjectStore
    from icefloe.ports.wal import WAL


class PortKind(enum.StrEnum):
    """The five ports; the value is the configuration section that selects the backend."""

    METADATA = "metadata"
    OBJECT_STORE = "object_store"
    WAL = "wal"
    TABLE = "table"
    COMPACTION = "compaction"


class BackendOptions(BaseModel):
    """Base of every backend's options model: unknown keys are errors, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoOptions(BackendOptions):
    """For backends that take no options."""


@dataclass(frozen=True)
class OpenContext:
    """What a backend may need besides its own options when it is opened.

    Attributes:
        data_dir: Folder for embedded backends' files (``--data-dir``, default ``./icefloe-data``).
        object_store: The configured object store, for backends layered on it (the object WAL,
            table formats that keep their files in object storage). ``None`` while the object
            store itself is being opened.
        wal: The configured WAL, for the compaction engine.
        config: The whole configuration, for backends that open ports in other processes
            (a compaction engine's workers) or read another backend's options (the local WAL
            reads the object WAL's prefix).
        before_local_task: Awaited by a compaction engine before it starts a task on this
            host (its worker processes): compaction waits there while the host's clients keep
            its cores busy. Engines that run tasks elsewhere (a Spark cluster) need not call it.
        watch_delay_s: How late this process's watchers may hear of changes other processes
            make (a compactor's: a tenth of a second); a metadata store that polls for them
            need not ask more often. Stores whose changes are pushed to watchers ignore it.
    """

    data_dir: Path
    object_store: ObjectStore | None = field(default=None)
    wal: WAL | None = field(default=None)
    config: Any = field(default=None)
    before_local_task: Callable[[], Awaitable[None]] | None = field(default=None)
    watch_delay_s: float = field(default=0.0)


class Port:
    """Base of every port.

    Subclasses (adapters) set ``capabilities`` to the optional features they implement and
    ``options_model`` to the pydantic model of their configuration section.
    """

    kind: ClassVar[PortKind]
    capabilities: ClassVar[frozenset[str]] = frozenset()
    options_model: ClassVar[type[BackendOptions]] = NoOptions

    @classmethod
    async def open(cls, options: Any, context: OpenContext) -> Self:
        """Create a connected adapter from its validated options.

        Args:
            options: An instance of ``cls.options_model``.
            context: Shared resources and paths; see :class:`OpenContext`.
        """
        raise NotImplementedError(f"{cls.__name__} does not implement open()")

    @classmethod
    def supports(cls, capability: str) -> bool:
        """Whether this adapter declares ``capability``."""
        return capability in cls.capabilities

    def require(self, capability: str) -> None:
        """Raise :class:`CapabilityError` unless this adapter declares ``capability``."""
        if not self.supports(capability):
            raise CapabilityError(
                f"{type(self).__name__} does not support {capability!r}; "
                f"check supports({capability!r}) before using it"
            )

    async def close(self) -> None:
        """Release connections and background tasks; idempotent. Later calls of other methods
        fail with ``ClosedError``."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()
