"""The ``consumer`` embedded protocol of classic groups: subscriptions and assignments.

The broker passes these bytes through untouched (assignment is client-side); it reads them
only to answer questions about a group: which topics it subscribes to (OffsetDelete refuses to
delete offsets of those), and which partitions each member owns (``icefloe groups describe``).
Each is a big-endian int16 version followed by that version's body; a newer version than kio
knows decodes as the newest known one, as Kafka's own consumer does.
"""

from __future__ import annotations

import importlib
import struct
from typing import Any, Final

from kio.serial import entity_reader

_MAX_VERSION: Final = 3
_VERSION = struct.Struct(">h")


def _read(kind: str, entity: str, value: bytes) -> Any | None:
    if len(value) < _VERSION.size:
        return None
    (version,) = _VERSION.unpack_from(value)
    if version < 0:
        return None
    module = importlib.import_module(
        f"kio.schema.consumer_protocol_{kind}.v{min(version, _MAX_VERSION)}.data"
    )
    try:
        decoded, _ = entity_reader(getattr(module, entity))(value, _VERSION.size)
    except Exception:  # noqa: BLE001 - client bytes: anything undecodable is "unknown"
        return None
    return decoded


def subscribed_topics(metadata: bytes) -> tuple[str, ...]:
    """Topics named by a member's subscription metadata (empty if it cannot be read)."""
    decoded = _read("subscription", "ConsumerProtocolSubscription", metadata)
    return tuple(decoded.topics) if decoded is not None else ()


def assigned_partitions(assignment: bytes) -> dict[str, tuple[int, ...]]:
    """Partitions by topic of a member's assignment (empty if it cannot be read)."""
    decoded = _read("assignment", "ConsumerProtocolAssignment", assignment)
    if decoded is None:
        return {}
    return {
        tp.topic: tuple(sorted(int(p) for p in tp.partitions)) for tp in decoded.assigned_partitions
    }
