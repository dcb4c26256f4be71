"""How table engines reach the bucket: the store's own endpoint and credentials, in each
engine's vocabulary, so that an operator sets them once, in ``[object_store.gcs]``.

pyarrow's GCS filesystem (pyiceberg's FileIO) takes no credentials file: with
``credentials_file`` or ``credentials_json``, Iceberg finds credentials through Application
Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``), as the store itself does when neither
is set.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Final

from icefloe_store_gcs.options import GCSObjectStoreOptions

EMULATOR_ENV: Final = "STORAGE_EMULATOR_HOST"
_EMULATOR_TOKEN_S: Final = 10 * 365 * 86400
"""Lifetime given to the placeholder token an emulator is sent (emulators check none)."""


@dataclass(frozen=True)
class GCSAccess:
    """An emulator's endpoint, or the credentials the store was configured with."""

    endpoint: str | None = None
    credentials_file: str | None = None
    credentials_json: str | None = None

    def object_store_options(self) -> dict[str, str]:
        """For delta-rs, DuckDB's delta extension and Polars (the ``object_store`` crate)."""
        if self.endpoint:
            # object_store reaches an emulator through a service-account key that names the
            # base URL and turns OAuth off.
            key = {
                "gcs_base_url": self.endpoint.rstrip("/"),
                "disable_oauth": True,
                "client_email": "",
                "private_key": "",
                "private_key_id": "",
            }
            return {"google_service_account_key": json.dumps(key)}
        if self.credentials_json:
            return {"google_service_account_key": self.credentials_json}
        if self.credentials_file:
            return {"google_service_account": self.credentials_file}
        return {}

    def iceberg_properties(self) -> dict[str, str]:
        """For pyiceberg's FileIO on pyarrow's ``GcsFileSystem``."""
        if not self.endpoint:
            return {}
        expires_ms = int((time.time() + _EMULATOR_TOKEN_S) * 1000)
        return {
            "gcs.service.host": self.endpoint.rstrip("/"),
            # Without a token pyarrow looks for Application Default Credentials and fails.
            "gcs.oauth2.token": "emulator",
            "gcs.oauth2.token-expires-at": str(expires_ms),
        }


def resolve_access(options: GCSObjectStoreOptions) -> GCSAccess:
    """What the store's client uses, for engines to use the same."""
    endpoint = options.endpoint or os.environ.get(EMULATOR_ENV) or None
    if endpoint and "://" not in endpoint:
        endpoint = f"http://{endpoint}"  # STORAGE_EMULATOR_HOST may be a bare host:port
    secret = options.credentials_json
    return GCSAccess(
        endpoint=endpoint,
        credentials_file=options.credentials_file,
        credentials_json=None if secret is None else secret.get_secret_value(),
    )
