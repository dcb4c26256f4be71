"""pyiceberg FileIO properties from the object store's engine settings.

``ObjectStore.engine_options()`` speaks the vocabulary of the Rust ``object_store`` crate
(what delta-rs, DuckDB's delta extension and Polars take: ``aws_access_key_id``, …). pyiceberg
has its own names (``s3.access-key-id``, …). This module translates the settings both sides
know; anything else is left out, and an operator can still set any pyiceberg property through
``[table.iceberg] properties``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

_TRANSLATION: Final[dict[str, str]] = {
    # S3 and S3-compatible services.
    "aws_access_key_id": "s3.access-key-id",
    "aws_secret_access_key": "s3.secret-access-key",
    "aws_session_token": "s3.session-token",
    "aws_region": "s3.region",
    "aws_endpoint": "s3.endpoint",
    "aws_endpoint_url": "s3.endpoint",
    "endpoint_url": "s3.endpoint",
    # Azure Blob / ADLS.
    "azure_storage_account_name": "adls.account-name",
    "azure_storage_account_key": "adls.account-key",
    "azure_storage_sas_key": "adls.sas-token",
    # Google Cloud Storage.
    "google_service_account_key": "gcs.service-account-key",
}


def fileio_properties(engine_options: Mapping[str, str]) -> dict[str, str]:
    """The pyiceberg FileIO properties equivalent to ``engine_options``.

    Args:
        engine_options: What ``ObjectStore.engine_options()`` returned.

    Returns:
        pyiceberg properties (``s3.endpoint``, …) for the keys both vocabularies share.
    """
    properties: dict[str, str] = {}
    for key, value in engine_options.items():
        name = _TRANSLATION.get(key.lower())
        if name is not None:
            properties[name] = value
    virtual = engine_options.get("aws_virtual_hosted_style_request")
    if virtual is not None:
        properties["s3.force-virtual-addressing"] = virtual
    return properties
