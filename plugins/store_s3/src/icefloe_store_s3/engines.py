"""How table engines reach the bucket: the store's own endpoint, region and credentials, in
each engine's vocabulary, so that an operator sets them once, in ``[object_store.s3]``.

Credentials are handed over only when they are static (set in the options, the environment
or a profile). Credentials that expire and refresh (an instance role, an assumed role) are
left out: each engine then finds them the same way boto3 did, through the standard chain.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from icefloe_store_s3.options import S3ObjectStoreOptions


@dataclass(frozen=True)
class S3Access:
    """Where the bucket is and who may write to it, as the store's client resolved it."""

    endpoint: str | None
    """A non-AWS endpoint (MinIO, moto, …); ``None`` for AWS itself."""
    region: str | None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    virtual_hosted: bool | None = None
    """``None``: each engine's default addressing for the endpoint."""

    def object_store_options(self) -> dict[str, str]:
        """For delta-rs, DuckDB's delta extension and Polars (the ``object_store`` crate)."""
        options = {
            "aws_endpoint": self.endpoint,
            "aws_region": self.region,
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key,
            "aws_session_token": self.session_token,
            # S3 (and MinIO, moto) honour If-None-Match on PUT: Delta commits use it to refuse
            # a second writer of the same log version, with no lock service.
            "aws_conditional_put": "etag",
        }
        if self.endpoint and self.endpoint.startswith("http://"):
            options["aws_allow_http"] = "true"
        if self.virtual_hosted is not None:
            options["aws_virtual_hosted_style_request"] = str(self.virtual_hosted).lower()
        return {key: value for key, value in options.items() if value is not None}

    def iceberg_properties(self) -> dict[str, str]:
        """For pyiceberg's and Iceberg Java's S3 FileIO (Spark, Trino, Flink). The two share
        the ``s3.*`` names but for the region and the addressing style, so both spellings are
        given; each ignores the other's."""
        properties = {
            "s3.endpoint": self.endpoint,
            "s3.region": self.region,
            "client.region": self.region,  # Java
            "s3.access-key-id": self.access_key_id,
            "s3.secret-access-key": self.secret_access_key,
            "s3.session-token": self.session_token,
        }
        if self.virtual_hosted is not None:
            properties["s3.force-virtual-addressing"] = str(self.virtual_hosted).lower()
            properties["s3.path-style-access"] = str(not self.virtual_hosted).lower()  # Java
        return {key: value for key, value in properties.items() if value is not None}


def resolve_access(options: S3ObjectStoreOptions, session: Any, client: Any) -> S3Access:
    """What ``client`` (made from ``session``) uses, for engines to use the same.

    Args:
        options: The store's options.
        session: The boto3 session the client came from (it resolved profile and environment).
        client: The boto3 S3 client.
    """
    from botocore.credentials import RefreshableCredentials  # type: ignore[import-untyped]

    endpoint = (
        options.endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    virtual = {"auto": None, "path": False, "virtual": True}[options.addressing_style]
    region = client.meta.region_name
    if options.access_key_id is not None and options.secret_access_key is not None:
        return S3Access(
            endpoint,
            region,
            options.access_key_id.get_secret_value(),
            options.secret_access_key.get_secret_value(),
            None if options.session_token is None else options.session_token.get_secret_value(),
            virtual,
        )
    credentials = session.get_credentials()
    if credentials is None or isinstance(credentials, RefreshableCredentials):
        return S3Access(endpoint, region, virtual_hosted=virtual)
    frozen = credentials.get_frozen_credentials()
    return S3Access(
        endpoint, region, frozen.access_key, frozen.secret_key, frozen.token or None, virtual
    )
