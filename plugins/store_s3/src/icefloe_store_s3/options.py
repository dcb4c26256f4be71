"""Options of ``[object_store] backend = "s3"`` (the ``[object_store.s3]`` table)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from icefloe.ports.base import BackendOptions
from icefloe.ports.object_store import validate_key

MIN_PART_SIZE = 5 << 20
"""S3 rejects multipart parts smaller than 5 MiB (except the last one)."""


class S3ObjectStoreOptions(BackendOptions):
    """Where the objects live, how to authenticate, and how hard to try.

    Every setting left unset falls back to boto3's own resolution, so the usual ``AWS_*``
    environment variables, ``~/.aws/config`` profiles and instance roles all work:
    ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``.
    """

    bucket: str = Field(min_length=3, max_length=63)
    """The bucket; it must exist (Icefloe never creates or deletes buckets)."""
    prefix: str = ""
    """Folder inside the bucket that holds this deployment's objects (``""``: the whole bucket)."""
    endpoint_url: str | None = None
    """An S3-compatible service (MinIO, moto, …); default: AWS, or ``AWS_ENDPOINT_URL_S3``."""
    region: str | None = None
    access_key_id: SecretStr | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    profile: str | None = None
    """A named profile of the shared AWS config files."""
    addressing_style: Literal["auto", "path", "virtual"] = "auto"
    """``path`` for most S3-compatible servers on an IP address or without wildcard DNS."""

    max_concurrency: int = Field(default=16, ge=1, le=512)
    """Threads running SDK calls, and HTTP connections kept in the pool."""
    part_size: int = Field(default=8 << 20, ge=MIN_PART_SIZE, le=5 << 30)
    """Bytes per multipart part; ``put_stream`` holds about one part in memory."""
    max_attempts: int = Field(default=5, ge=1, le=20)
    """Attempts per request (the first included) on throttling, 5xx and connection errors."""
    retry_mode: Literal["standard", "adaptive"] = "standard"
    """botocore's retry mode: exponential backoff with jitter, plus client-side rate limiting
    for ``adaptive``."""
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=60.0, gt=0)

    @field_validator("prefix")
    @classmethod
    def _prefix_is_a_folder(cls, prefix: str) -> str:
        if prefix:
            validate_key(prefix)  # its ValueError names the problem
        return prefix

    @model_validator(mode="after")
    def _keys_come_in_pairs(self) -> Self:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("set both access_key_id and secret_access_key, or neither")
        return self
