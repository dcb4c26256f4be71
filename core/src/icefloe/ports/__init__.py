"""The five ports every Icefloe backend plugs into.

Each port is an abstract base class whose public methods validate arguments once and then call
the adapter's underscore-prefixed primitive. Adapters declare optional capabilities in their
``capabilities`` class attribute; core checks with ``supports()`` before using one.
"""

from __future__ import annotations

from icefloe.ports.base import BackendOptions, NoOptions, OpenContext, Port, PortKind
from icefloe.ports.compaction import CompactionEngine, CompactionTask, StreamRange, WrittenFile
from icefloe.ports.metadata import (
    MUST_NOT_EXIST,
    EventKind,
    MetadataStore,
    Record,
    Session,
    Watch,
    WatchEvent,
)
from icefloe.ports.object_store import ObjectInfo, ObjectStore, RequestKind, RequestStats
from icefloe.ports.table import CommitResult, DataFile, TableFormat, TableInfo, TableSpec
from icefloe.ports.wal import WAL, WalObjectInfo

PORTS: dict[PortKind, type[Port]] = {
    PortKind.METADATA: MetadataStore,
    PortKind.OBJECT_STORE: ObjectStore,
    PortKind.WAL: WAL,
    PortKind.TABLE: TableFormat,
    PortKind.COMPACTION: CompactionEngine,
}
"""Each port's class, by kind."""

__all__ = [
    "MUST_NOT_EXIST",
    "PORTS",
    "WAL",
    "BackendOptions",
    "CommitResult",
    "CompactionEngine",
    "CompactionTask",
    "DataFile",
    "EventKind",
    "MetadataStore",
    "NoOptions",
    "ObjectInfo",
    "ObjectStore",
    "OpenContext",
    "Port",
    "PortKind",
    "Record",
    "RequestKind",
    "RequestStats",
    "Session",
    "StreamRange",
    "TableFormat",
    "TableInfo",
    "TableSpec",
    "WalObjectInfo",
    "Watch",
    "WatchEvent",
    "WrittenFile",
]
