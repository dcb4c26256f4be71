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
DEAD_LETTERS: Final = "dead-letters"
DEAD_LETTER_METADATA: Final = "dead-letter-metadata"
"""Roots of the dead-letter tables of schema-backed topics (data, Iceberg metadata): apart
from every topic's own folders, whatever the topic names."""
DEAD_LETTER_SUFFIX: Final = "_dead_letters"


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


def dead_letter_root(topic: str) -> str:
    """Object-store key prefix of the dead-letter table's data files."""
    return f"{DEAD_LETTERS}/{topic}"


def dead_letter_file(topic: str, partition: int, name: str) -> str:
    """Object-store key of one dead-letter data file."""
    return f"{dead_letter_root(topic)}/partition={partition}/{name}"


def dead_letter_relative_path(topic: str, key: str) -> str:
    """A dead-letter file's path relative to its table's root."""
    prefix = dead_letter_root(topic) + "/"
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not inside the dead-letter root {prefix!r}")
    return key[len(prefix) :]


def dead_letter_metadata_root(topic: str) -> str:
    return f"{DEAD_LETTER_METADATA}/{topic}"


def dead_letter_spec(store: ObjectStore, spec: TableSpec, topic: str) -> TableSpec:
    """The dead-letter table of ``topic``, whose table is ``spec``: ``<table>_dead_letters``
    in the same namespace, partitioned by Kafka partition only."""
    sides = [side for side in columns.SIDES if columns.error_column(side) in spec.schema.names]
    return TableSpec(
        namespace=spec.namespace,
        name=spec.name + DEAD_LETTER_SUFFIX,
        location=store.url(dead_letter_root(topic)),
        schema=columns.dead_letter_schema(sides),
        metadata_location=store.url(dead_letter_metadata_root(topic)),
    )


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
