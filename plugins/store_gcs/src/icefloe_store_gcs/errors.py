"""google-cloud-storage's exceptions, translated into :mod:`icefloe.errors`."""

from __future__ import annotations

from typing import Final

from icefloe.errors import (
    ConfigError,
    ConflictError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)

RETRIABLE_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})


def status_of(exc: BaseException) -> int:
    """The HTTP status behind an SDK exception, or 0 when there was no answer."""
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return code
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else 0


def translate(exc: Exception, what: str, bucket: str) -> IcefloeError:
    """The :mod:`icefloe.errors` exception for a failed SDK call (the caller raises it ``from``).

    Args:
        exc: What the SDK raised, after its own retries.
        what: The operation and key, for the message (``"get 'wal/x'"``).
        bucket: The configured bucket, named in configuration errors.
    """
    from google.auth import exceptions as auth_errors

    if isinstance(exc, auth_errors.DefaultCredentialsError):
        return ConfigError(
            f"GCS {what}: no Google credentials: set [object_store.gcs] credentials_file or "
            "GOOGLE_APPLICATION_CREDENTIALS (or anonymous = true for an emulator)"
        )
    if isinstance(exc, IcefloeError):
        return exc
    status = status_of(exc)
    if status == 404:
        return NotFoundError(f"GCS {what}: not found")
    if status == 412:
        return ConflictError(f"GCS {what}: precondition failed")
    if status in (401, 403):
        return StorageError(
            f"GCS {what}: permission denied on bucket {bucket!r} ({status}); check the "
            "credentials and the bucket's IAM roles"
        )
    if status in RETRIABLE_STATUSES or status == 0:
        # No status: the connection failed or timed out, after the SDK's retries.
        return UnavailableError(f"GCS {what}: unavailable after retries: {exc}")
    return StorageError(f"GCS {what}: HTTP {status}: {exc}")
