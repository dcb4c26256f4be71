"""Where a topic table's files live in the object store.

The Delta table root and the Iceberg table location are the same folder, holding the data files
(``<root>/partition=<p>/<file>.parquet``; Delta references them by relative path). Iceberg's own
metadata goes to a folder outside that root, or a Delta vacuum would delete it.

Locations follow the topic's name, not the table's identifier (:mod:`icefloe.table_names`):
the identifier may change (an alias set later) without a file moving, and two topics never
share a folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import pyarrow as pa

from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableSpec, TimePartition
from icefloe.schemas import columns
from icefloe.storage.row_schema import ROW_SCHEMA
from icefloe.table_names import TableName

TABLES: Final = "tables"
ICEBERG_METADATA: Final = "iceberg-metadata"


def table_root(topic: str) -> str:
    """Object-store key prefix of the table's data files (no trailing slash)."""
    return f"{TABLES}/{topic}"


def data_file(topic: str, partition: int, name: str) -> str:
    """Object-store key of one data file."""
    return f"{table_root(topic)}/partition={partition}/{name}"


def relative_path(topic: str, key: str) -> str:
    """A data file's path relative to the table root (as Delta records it)."""
    prefix = table_root(topic) + "/"
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not inside the table root {prefix!r}")
    return key[len(prefix) :]


def iceberg_metadata_root(topic: str) -> str:
    """Object-store key prefix of the Iceberg metadata, outside the table root."""
    return f"{ICEBERG_METADATA}/{topic}"


def table_spec(
    store: ObjectStore,
    name: TableName,
    topic: str,
    time_partition: TimePartition | None = None,
    typed_sides: Sequence[str] = (),
) -> TableSpec:
    """The table of ``topic``, called ``name``: its identifier, schema, and locations.

    A schema-backed topic's table starts with the schema-id and error columns of its typed
    ``sides``; the typed struct columns join it with the first data file that has them (each
    commit evolves the table to cover the files it adds, :mod:`icefloe.ports.table`).
    """
    return TableSpec(
        namespace=name.namespace,
        name=name.name,
        location=store.url(table_root(topic)),
        schema=pa.schema([*ROW_SCHEMA, *columns.fixed_fields(typed_sides)]),
        metadata_location=store.url(iceberg_metadata_root(topic)),
        time_partition=time_partition,
    )
