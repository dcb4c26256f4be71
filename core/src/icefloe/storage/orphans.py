"""Deleting WAL objects that were written but never committed (a crash between the two steps).

Why this is safe: a writer never appends an index entry for a WAL object older than
``storage.commit_deadline_s`` (see :mod:`icefloe.storage.writer`), and the grace period is longer
than that deadline. So once an object is older than the grace period, the set of index entries
that will ever reference it is already fixed: if none does now, none ever will. Clocks of the
processes involved must agree to within the difference of the two settings.
"""

from __future__ import annotations

import logging
import time

from icefloe.ports.metadata import MetadataStore
from icefloe.ports.wal import WAL
from icefloe.quiet_log import summary
from icefloe.storage import index, keys
from icefloe.storage.index import WalLocation

log = logging.getLogger(__name__)


class OrphanCollector:
    """Finds and deletes unreferenced WAL objects older than the grace period."""

    def __init__(self, wal: WAL, metadata: MetadataStore, grace_s: float) -> None:
        self._wal = wal
        self._metadata = metadata
        self._grace = grace_s

    async def collect(self) -> list[str]:
        """Delete orphaned WAL objects; return their references."""
        cutoff = time.time() - self._grace
        candidates = [info.ref async for info in self._wal.list() if info.created < cutoff]
        if not candidates:
            return []
        # Listed first, references read second: an entry committed in between references an
        # object younger than the cutoff, which is not a candidate.
        referenced = await self.referenced_refs()
        orphans = [ref for ref in candidates if ref not in referenced]
        for ref in orphans:
            log.debug("deleting orphaned WAL object %s", ref)
            await self._wal.delete(ref)
        if orphans:
            log.info("deleted %s", summary(orphans, "orphaned WAL object"))
        return orphans

    async def referenced_refs(self) -> set[str]:
        """Every WAL reference held by an index entry of any stream."""
        referenced: set[str] = set()
        async for record in self._metadata.scan_all(*keys.streams_range()):
            if keys.is_index_key(record.key):
                location = index.decode(record.key, record.value).location
                if isinstance(location, WalLocation):
                    referenced.add(location.ref)
        return referenced
