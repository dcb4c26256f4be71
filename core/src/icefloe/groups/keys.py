"""Where group state lives in the metadata store.

Four key families, each under its own top-level prefix so that a scan of one never walks
through another (listing groups must not read every committed offset)::

    groups/<group>                              the group record (one key: see model.py)
    group-leases/<group>                        ephemeral: the broker running its timers
    group-alive/<group>/<member>                last time a member was heard from
    group-offsets/<group>/<topic>/<partition>   a committed offset

Group and member ids are arbitrary strings, so they are percent-encoded: a ``/`` inside an id
must not look like a path separator. Topic names are encoded too: a legal name stays as it is,
but a client may commit or fetch offsets of any string, NUL included.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import quote, unquote

from icefloe import keyspace

GROUPS: Final = keyspace.GROUPS
LEASES: Final = keyspace.GROUP_LEASES
ALIVE: Final = keyspace.GROUP_ALIVE
OFFSETS: Final = keyspace.GROUP_OFFSETS


def escape(name: str) -> str:
    """``name`` as one path component: percent-encoded, never empty, never containing ``/``."""
    return quote(name, safe="")


def unescape(component: str) -> str:
    return unquote(component)


def group(group_id: str) -> str:
    return GROUPS + escape(group_id)


def lease(group_id: str) -> str:
    return LEASES + escape(group_id)


def alive_prefix(group_id: str) -> str:
    return f"{ALIVE}{escape(group_id)}/"


def alive(group_id: str, member_id: str) -> str:
    return alive_prefix(group_id) + escape(member_id)


def offsets_prefix(group_id: str, topic: str | None = None) -> str:
    base = f"{OFFSETS}{escape(group_id)}/"
    return base if topic is None else f"{base}{escape(topic)}/"


def offset(group_id: str, topic: str, partition: int) -> str:
    # Zero-padded so that a scan returns partitions in numeric order.
    return f"{offsets_prefix(group_id, topic)}{partition:010d}"


def parse_offset(key: str) -> tuple[str, int]:
    """(topic, partition) of an offset key."""
    *_, topic, partition = key.split("/")
    return unescape(topic), int(partition)


def group_of(key: str, prefix: str) -> str | None:
    """The group id a key under ``prefix`` belongs to, or ``None`` if it is not under it."""
    if not key.startswith(prefix):
        return None
    return unescape(key[len(prefix) :].split("/", 1)[0])
