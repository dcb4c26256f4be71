"""Options of the ``iceberg`` table format (the ``[table.iceberg]`` table)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, SecretStr, model_validator

from icefloe.ports.base import BackendOptions

DEFAULT_SQLITE_FILE = "iceberg-catalog.db"
"""The embedded catalog's file, in the data folder, when ``catalog = "sql"`` sets no ``uri``."""


class IcebergTableFormatOptions(BackendOptions):
    """Which Iceberg catalog holds the tables, and how to reach it.

    The default needs nothing: a pyiceberg ``SqlCatalog`` on a SQLite file in the data folder,
    with the warehouse in Icefloe's object store. ``catalog = "rest"`` talks to any Iceberg REST
    catalog (Polaris, Gravitino, Nessie, Lakekeeper, AWS Glue's endpoint, the reference server).
    """

    catalog: Literal["sql", "rest"] = "sql"
    """The kind of catalog: ``sql`` (SQLAlchemy; SQLite by default) or ``rest``."""
    name: str = Field(default="icefloe", min_length=1)
    """The catalog's name; a SQL catalog keys its rows by it, so several can share a database."""
    uri: str | None = None
    """``sql``: a SQLAlchemy URL (default ``sqlite:///<data_dir>/iceberg-catalog.db``).
    ``rest``: the catalog's base URL, e.g. ``https://catalog.example.com/api/catalog``."""
    warehouse: str | None = None
    """The warehouse location (``sql``: default ``<object store>/iceberg-warehouse``) or, for
    ``rest``, the warehouse name the server expects. Icefloe gives every table an explicit
    location, so this matters only to the catalog."""
    credential: SecretStr | None = None
    """``rest``: OAuth2 client credentials ``"<client id>:<secret>"``."""
    token: SecretStr | None = None
    """``rest``: a bearer token."""
    properties: dict[str, str] = Field(default_factory=dict)
    """Extra pyiceberg catalog properties (``s3.endpoint``, ``header.X-Iceberg-Access-Delegation``,
    ``oauth2-server-uri``, …); they win over what Icefloe derives from the object store."""
    max_workers: int = Field(default=4, ge=1, le=64)
    """Threads running pyiceberg calls (it is synchronous)."""

    @model_validator(mode="after")
    def _rest_needs_a_uri(self) -> Self:
        if self.catalog == "rest" and not self.uri:
            raise ValueError('catalog = "rest" needs uri = "<the REST catalog\'s base URL>"')
        if self.catalog == "sql" and (self.credential or self.token):
            raise ValueError('credential and token apply only to catalog = "rest"')
        return self
