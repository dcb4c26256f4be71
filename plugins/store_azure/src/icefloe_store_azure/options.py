"""Options of ``[object_store] backend = "azure"`` (the ``[object_store.azure]`` table)."""

from __future__ import annotations

from typing import Final, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from icefloe.ports.base import BackendOptions
from icefloe.ports.object_store import validate_key

MAX_BLOCK_SIZE: Final = 4000 << 20
"""Azure's largest block in a block blob (4000 MiB)."""


class AzureObjectStoreOptions(BackendOptions):
    """Where the blobs live, how to authenticate, and how hard to try.

    Credentials, first match wins: ``connection_string``; ``account_url`` with
    ``account_key`` or ``sas_token``; the environment variable
    ``AZURE_STORAGE_CONNECTION_STRING``; ``AZURE_STORAGE_ACCOUNT`` with ``AZURE_STORAGE_KEY``
    or ``AZURE_STORAGE_SAS_TOKEN`` (the Azure CLI's names).
    """

    container: str = Field(min_length=3, max_length=63)
    """The container; it must exist (Icefloe never creates or deletes containers)."""
    prefix: str = ""
    """Folder inside the container for this deployment's blobs (``""``: the whole container)."""
    connection_string: SecretStr | None = None
    account_url: str | None = None
    """``https://<account>.blob.core.windows.net`` (or an emulator's URL)."""
    account_key: SecretStr | None = None
    sas_token: SecretStr | None = None

    max_concurrency: int = Field(default=16, ge=1, le=512)
    """Threads running SDK calls, and HTTP connections kept in the pool."""
    part_size: int = Field(default=8 << 20, ge=1, le=MAX_BLOCK_SIZE)
    """Bytes per staged block; ``put_stream`` holds about one block in memory."""
    max_attempts: int = Field(default=5, ge=1, le=20)
    """Attempts per request (the first included) on throttling, 5xx and connection errors."""
    initial_backoff: float = Field(default=0.5, ge=0)
    """Seconds before the first retry; later retries wait exponentially longer, with jitter."""
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=60.0, gt=0)

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_folder(cls, prefix: str) -> str:
        if prefix:
            validate_key(prefix)  # its ValueError names the problem
        return prefix

    @model_validator(mode="after")
    def _one_way_to_authenticate(self) -> Self:
        if self.connection_string is not None and (
            self.account_url or self.account_key or self.sas_token
        ):
            raise ValueError("set connection_string, or account_url with a key or SAS, not both")
        if self.account_key is not None and self.sas_token is not None:
            raise ValueError("set account_key or sas_token, not both")
        if (self.account_key or self.sas_token) and not self.account_url:
            raise ValueError("account_key and sas_token need account_url")
        return self
