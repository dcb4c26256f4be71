"""Builds the boto3 S3 client from the options. Imported only when the backend is opened."""

from __future__ import annotations

from typing import Any

import boto3  # type: ignore[import-untyped]
from botocore.config import Config  # type: ignore[import-untyped]

from icefloe_store_s3.engines import S3Access, resolve_access
from icefloe_store_s3.options import S3ObjectStoreOptions


def make_client(options: S3ObjectStoreOptions) -> tuple[Any, S3Access]:
    """A thread-safe S3 client with retries, timeouts and a pool sized from ``options``, and
    how table engines reach the bucket the same way.

    Settings left unset are resolved by boto3 (environment, config files, instance role).
    """
    session = boto3.session.Session(profile_name=options.profile, region_name=options.region)
    config = Config(
        retries={"mode": options.retry_mode, "total_max_attempts": options.max_attempts},
        connect_timeout=options.connect_timeout,
        read_timeout=options.read_timeout,
        # One connection per worker thread: a thread never waits for a pooled connection.
        max_pool_connections=options.max_concurrency,
        s3={"addressing_style": options.addressing_style},
        # Checksums only where S3 requires them: the SDK's default trailing checksums turn
        # every upload into a chunked stream, which some S3-compatible servers reject.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    client = session.client(
        "s3",
        endpoint_url=options.endpoint_url,
        aws_access_key_id=_reveal(options.access_key_id),
        aws_secret_access_key=_reveal(options.secret_access_key),
        aws_session_token=_reveal(options.session_token),
        config=config,
    )
    return client, resolve_access(options, session, client)


def _reveal(secret: Any) -> str | None:
    return None if secret is None else str(secret.get_secret_value())
