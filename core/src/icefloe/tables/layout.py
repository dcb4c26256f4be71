"""What a topic table is called and where its files live in the object store.

The Delta table root and the Iceberg table location are the same folder, holding the data files
(``<root>/partition=<p>/<file>.parquet``; Delta references them by relative path). Iceberg's own
metadata goes to a folder outside that root, or a Delta vacuum would delete it.
"""

from __future__ import annotations

from typing import Final

from icefloe.ports.object_store import ObjectStore
from icefloe.ports.table import TableSpec
from icefloe.storage.row_schema import ROW_SCHEMA

TABLES: Final = "tables"
ICEBERG_METADATA: Final = "iceberg-metadata"


def table_root(namespace: str, topic: str) -> str:
    """Object-store key prefix of the table's data files (no trailing slash)."""
    return f"{TABLES}/{namespace}/{topic}"


def data_file(namespace: str, topic: str, partition: int, name: str) -> str:
    """Object-store key of one data file."""
    return f"{table_root(namespace, topic)}/partition={partition}/{name}"


def relative_path(namespace: str, topic: str, key: str) -> str:
    """A data file's path relative to the table root (as Delta records it)."""
    prefix = table_root(namespace, topic) + "/"
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not inside the table root {prefix!r}")
    return key[len(prefix) :]


def iceberg_metadata_root(namespace: str, topic: str) -> str:
    """Object-store key prefix of the Iceberg metadata, outside the table root."""
    return f"{ICEBERG_METADATA}/{namespace}/{topic}"


def table_name(topic: str) -> str:
    """Table identifiers treat ``.`` as a namespace separator: topics use ``_`` instead."""
    return topic.replace(".", "_")


def table_spec(store: ObjectStore, namespace: str, topic: str) -> TableSpec:
    """The table of ``topic``: its identifier, schema, and locations in ``store``."""
    return TableSpec(
        namespace=namespace,
        name=table_name(topic),
        location=store.url(table_root(namespace, topic)),
        schema=ROW_SCHEMA,
        metadata_location=store.url(iceberg_metadata_root(namespace, topic)),
    )
