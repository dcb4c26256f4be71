"""Cluster-wide counters in the metadata store, advanced by compare-and-set."""

from __future__ import annotations

from icefloe.errors import ConflictError
from icefloe.ports.metadata import MUST_NOT_EXIST, MetadataStore
from icefloe.storage import keys


async def increment(metadata: MetadataStore, name: str, by: int = 1) -> int:
    """Add ``by`` to the counter ``name`` (absent counts as 0) and return the new value.

    Concurrent callers anywhere in the cluster each get a distinct value.
    """
    key = keys.counter(name)
    while True:
        record = await metadata.get(key)
        value = (int(record.value) if record else 0) + by
        try:
            await metadata.put(
                key,
                str(value).encode(),
                expected_version=record.version if record else MUST_NOT_EXIST,
            )
            return value
        except ConflictError:
            continue  # another process advanced it first: read again
