"""The engines users query Icefloe's tables with — pyiceberg, delta-rs and DuckDB — each
configured only from what the object store plugin hands engines (``engine_options()`` and
``iceberg_properties()``), so that a test proves a user can reach the tables the same way."""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from icefloe.testing.table_contract import Row, rows_of


def iceberg_rows(identifier: str, catalog_file: Path, properties: Mapping[str, str]) -> list[Row]:
    """The table through pyiceberg and the embedded SQLite catalog's file."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("icefloe", uri=f"sqlite:///{catalog_file}", **properties)
    return rows_of(catalog.load_table(identifier).scan().to_arrow())


def delta_rows(location: str, storage_options: Mapping[str, str]) -> list[Row]:
    """The table through delta-rs's own query engine (not ``to_pyarrow_table()``: with
    delta-rs 1.6 a process that called it may abort at exit)."""
    from deltalake import DeltaTable, QueryBuilder

    table = DeltaTable(location, storage_options=dict(storage_options))
    query = QueryBuilder().register("t", table)
    sql = 'SELECT partition, "offset", key, value FROM t'
    return rows_of(pa.table(query.execute(sql).read_all()))


def duckdb_connection(engine_options: Mapping[str, str] | None = None) -> Any:
    """DuckDB with the extensions its PyPI packages ship (nothing is downloaded), and a secret
    for the object store that ``engine_options`` describe."""
    import duckdb

    connection = duckdb.connect()
    connection.execute("SET autoinstall_known_extensions = false")
    connection.execute("SET autoload_known_extensions = false")
    platform = connection.execute("PRAGMA platform").fetchone()[0]
    folder = importlib.resources.files("duckdb_ext") / "extensions" / f"v{duckdb.__version__}"
    for extension in ("httpfs", "azure", "avro", "iceberg", "delta"):  # iceberg needs avro first
        connection.execute(f"LOAD '{folder / platform / extension}.duckdb_extension'")
    if engine_options:
        connection.execute(_secret(engine_options))
    return connection


def duckdb_rows(relation: str, engine_options: Mapping[str, str] | None = None) -> list[Row]:
    # "offset" and "timestamp" are SQL keywords: quoted.
    sql = f'SELECT "partition", "offset", "key", "value" FROM {relation}'
    connection = duckdb_connection(engine_options)
    return rows_of(pa.table(connection.execute(sql).fetch_arrow_table()))


def _secret(options: Mapping[str, str]) -> str:
    """A DuckDB ``CREATE SECRET`` for the store ``options`` (object_store vocabulary) reach."""
    if "aws_endpoint" in options or "aws_access_key_id" in options:
        endpoint = urlsplit(options.get("aws_endpoint", "https://s3.amazonaws.com"))
        return _create_secret(
            TYPE="s3",
            KEY_ID=options.get("aws_access_key_id", ""),
            SECRET=options.get("aws_secret_access_key", ""),
            REGION=options.get("aws_region", "us-east-1"),
            ENDPOINT=endpoint.netloc,
            URL_STYLE="path",
            USE_SSL=str(endpoint.scheme == "https").lower(),
        )
    if "azure_storage_account_name" in options:
        account = options["azure_storage_account_name"]
        endpoint = options.get("azure_endpoint", f"https://{account}.blob.core.windows.net")
        connection_string = (
            f"AccountName={account};AccountKey={options.get('azure_storage_account_key', '')};"
            f"BlobEndpoint={endpoint};"
        )
        return _create_secret(TYPE="azure", CONNECTION_STRING=connection_string)
    if "google_service_account_key" in options:
        # An emulator (engines get its base URL inside a key); DuckDB speaks GCS's XML API
        # with HMAC keys, which an emulator does not check.
        base_url = json.loads(options["google_service_account_key"]).get("gcs_base_url")
        if base_url:
            endpoint = urlsplit(base_url)
            return _create_secret(
                TYPE="gcs",
                KEY_ID="emulator",
                SECRET="emulator",
                ENDPOINT=endpoint.netloc,
                URL_STYLE="path",
                USE_SSL=str(endpoint.scheme == "https").lower(),
            )
    raise ValueError(f"no DuckDB secret for these engine options: {sorted(options)}")


def _create_secret(**fields: str) -> str:
    body = ", ".join(
        f"{name} {value}" if name in ("TYPE", "USE_SSL") else f"{name} '{value}'"
        for name, value in fields.items()
    )
    return f"CREATE SECRET ({body})"
