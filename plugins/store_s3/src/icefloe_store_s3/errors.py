"""botocore's exceptions, translated into :mod:`icefloe.errors`."""

from __future__ import annotations

from typing import Any, Final

from icefloe.errors import (
    ConfigError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)

NOT_FOUND_CODES: Final = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchUpload"})
PRECONDITION_CODES: Final = frozenset({"412", "PreconditionFailed"})
CONCURRENT_CONDITIONAL_WRITE: Final = "ConditionalRequestConflict"
"""409 from S3: another conditional write to the key is in flight; the request may be retried."""
RANGE_NOT_SATISFIABLE: Final = frozenset({"416", "InvalidRange"})
_THROTTLING_CODES: Final = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "RequestTimeout"}
)


def error_code(exc: BaseException) -> str:
    """The S3 error code of a ``ClientError`` (``"NoSuchKey"``, ``"412"``, …), else ``""``."""
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return ""
    return str(response.get("Error", {}).get("Code", ""))


def status_of(exc: BaseException) -> int:
    response: Any = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return 0
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def translate(exc: Exception, what: str, bucket: str) -> IcefloeError:
    """The :mod:`icefloe.errors` exception for a failed SDK call (the caller raises it ``from``).

    Args:
        exc: What botocore raised, after its own retries.
        what: The operation and key, for the message (``"get 'wal/x'"``).
        bucket: The configured bucket, named in configuration errors.
    """
    from botocore import exceptions as bx  # type: ignore[import-untyped]

    if isinstance(exc, bx.NoCredentialsError | bx.PartialCredentialsError):
        return ConfigError(
            f"S3 {what}: no AWS credentials: set [object_store.s3] access_key_id and "
            f"secret_access_key, or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
        )
    if isinstance(exc, bx.ClientError):
        code, status = error_code(exc), status_of(exc)
        if code == "NoSuchBucket":
            return StorageError(
                f"S3 {what}: bucket {bucket!r} does not exist; create it or fix "
                "[object_store.s3] bucket"
            )
        if code in NOT_FOUND_CODES:
            return NotFoundError(f"S3 {what}: not found")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StorageError(
                f"S3 {what}: {code} on bucket {bucket!r}; check the credentials and the "
                "bucket policy"
            )
        if status >= 500 or status == 429 or code in _THROTTLING_CODES:
            return UnavailableError(f"S3 {what}: {code or status} after retries; try again later")
        return StorageError(f"S3 {what}: {code or status}: {exc}")
    if isinstance(
        exc,
        bx.EndpointConnectionError
        | bx.ConnectionClosedError
        | bx.ConnectTimeoutError
        | bx.ReadTimeoutError
        | bx.HTTPClientError,
    ):
        return UnavailableError(f"S3 {what}: cannot reach the service: {exc}")
    return StorageError(f"S3 {what}: {exc}")
