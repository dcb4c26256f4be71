"""Options of ``[object_store] backend = "gcs"`` (the ``[object_store.gcs]`` table)."""

from __future__ import annotations

from typing import Final, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from icefloe.ports.base import BackendOptions
from icefloe.ports.object_store import validate_key

CHUNK_MULTIPLE: Final = 256 << 10
"""GCS accepts resumable-upload chunks only in multiples of 256 KiB (except the last)."""


class GCSObjectStoreOptions(BackendOptions):
    """Where the objects live, how to authenticate, and how hard to try.

    Unset settings fall back to the SDK's usual sources: ``STORAGE_EMULATOR_HOST`` for the
    endpoint (and then anonymous credentials, as the SDK does for emulators),
    ``GOOGLE_APPLICATION_CREDENTIALS`` and the other Application Default Credentials for
    authentication, ``GOOGLE_CLOUD_PROJECT`` for the project.
    """

    bucket: str = Field(min_length=3, max_length=222)
    """The bucket; it must exist (Icefloe never creates or deletes buckets)."""
    prefix: str = ""
    """Folder inside the bucket that holds this deployment's objects (``""``: the whole bucket)."""
    endpoint: str | None = None
    """A GCS-compatible endpoint (an emulator); default: Google, or ``STORAGE_EMULATOR_HOST``."""
    project: str | None = None
    credentials_file: str | None = None
    """A service-account or other credentials JSON file (default: Application Default
    Credentials, e.g. ``GOOGLE_APPLICATION_CREDENTIALS``)."""
    credentials_json: SecretStr | None = None
    """The same JSON inline, for secret stores that hand out values rather than files."""
    anonymous: bool = False
    """Send no credentials (public buckets, emulators); implied for an emulator endpoint."""

    max_concurrency: int = Field(default=16, ge=1, le=512)
    """Threads running SDK calls, and HTTP connections kept in the pool."""
    part_size: int = Field(default=8 << 20, ge=CHUNK_MULTIPLE, le=1 << 30)
    """Bytes per resumable-upload chunk; ``put_stream`` holds about one chunk in memory."""
    initial_backoff: float = Field(default=0.5, gt=0)
    """Seconds before the first retry of a throttled, failed (5xx) or dropped request."""
    max_backoff: float = Field(default=16.0, gt=0)
    retry_deadline: float = Field(default=120.0, gt=0)
    """Seconds after which a request that keeps failing is given up (``UnavailableError``)."""
    timeout: float = Field(default=60.0, gt=0)
    """Seconds to wait for a connection or an answer, per attempt."""

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_folder(cls, prefix: str) -> str:
        if prefix:
            validate_key(prefix)  # its ValueError names the problem
        return prefix

    @field_validator("part_size")
    @classmethod
    def _part_size_is_a_chunk_multiple(cls, size: int) -> int:
        if size % CHUNK_MULTIPLE:
            raise ValueError(f"part_size must be a multiple of 256 KiB ({CHUNK_MULTIPLE})")
        return size

    @model_validator(mode="after")
    def _one_source_of_credentials(self) -> Self:
        given = [self.credentials_file, self.credentials_json, self.anonymous or None]
        if sum(value is not None for value in given) > 1:
            raise ValueError("set at most one of credentials_file, credentials_json, anonymous")
        return self
