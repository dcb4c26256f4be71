"""Dropping the tables of a deleted topic.

A deleted topic takes its tables along, as Kafka takes a deleted topic's data. The compaction
leader drops them before it compacts anything else, so a topic created again under the same
name starts with new, empty tables, in the same folders: its data files never share a name
with the old ones (:func:`icefloe.ports.compaction.data_file_name`), and the old Iceberg
metadata is deleted only up to the deletion time.

Each step can be repeated, so a leader that dies half way leaves work the next one finishes:
the data files the tables reference are deleted first (while the tables can still list them),
then the tables, then the old Iceberg metadata.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping

from icefloe.errors import NotFoundError
from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableFormat, TableSpec
from icefloe.tables import layout
from icefloe.topics.registry import DeletedTopic

log = logging.getLogger(__name__)


async def drop_tables(
    deleted: DeletedTopic,
    spec: TableSpec,
    table_formats: Mapping[str, TableFormat],
    store: ObjectStore,
    *,
    root: str | None = None,
    metadata_root: str | None = None,
) -> int:
    """Drop ``deleted``'s tables (``spec``) in every format and delete their files; return
    the number of objects deleted. ``root`` and ``metadata_root`` name the folders of another
    of the topic's tables than its own (its dead-letter table)."""
    name = deleted.topic.name
    root = root or layout.table_root(name)
    data_files: set[str] = set()
    for table_format in table_formats.values():
        with contextlib.suppress(NotFoundError):  # never created, or dropped by an earlier try
            data_files.update(f"{root}/{f.path}" for f in await table_format.files(spec))
    for key in sorted(data_files):
        await store.delete(key)
    for table_format in table_formats.values():
        await table_format.drop(spec)
    # Objects written after the deletion belong to a topic created again under the name.
    deleted_s = deleted.deleted_ms / 1000
    metadata = [
        info.key
        async for info in store.list((metadata_root or layout.iceberg_metadata_root(name)) + "/")
        if info.modified <= deleted_s
    ]
    for key in metadata:
        await store.delete(key)
    log.info(
        "dropped the tables of deleted topic %s: %d data files, %d metadata files",
        name,
        len(data_files),
        len(metadata),
    )
    return len(data_files) + len(metadata)
