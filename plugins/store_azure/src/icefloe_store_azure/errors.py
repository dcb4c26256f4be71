"""azure-storage-blob's exceptions, translated into :mod:`icefloe.errors`."""

from __future__ import annotations

from typing import Final

from icefloe.errors import (
    ConflictError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)

CONDITION_CODES: Final = frozenset({"BlobAlreadyExists", "ConditionNotMet"})
"""What Azure answers a refused ``If-None-Match: *`` (409 on blob creation, 412 otherwise)."""
RETRIABLE_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})


def status_of(exc: BaseException) -> int:
    status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else 0


def error_code_of(exc: BaseException) -> str:
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or "")


def translate(exc: Exception, what: str, container: str) -> IcefloeError:
    """The :mod:`icefloe.errors` exception for a failed SDK call (the caller raises it ``from``).

    Args:
        exc: What the SDK raised, after its own retries.
        what: The operation and key, for the message (``"get 'wal/x'"``).
        container: The configured container, named in configuration errors.
    """
    from azure.core import exceptions as az

    if isinstance(exc, IcefloeError):
        return exc
    status, code = status_of(exc), error_code_of(exc)
    if code == "ContainerNotFound":
        return StorageError(
            f"Azure {what}: container {container!r} does not exist; create it or fix "
            "[object_store.azure] container"
        )
    if code in CONDITION_CODES:
        return ConflictError(f"Azure {what}: {code}")
    if status == 404:
        return NotFoundError(f"Azure {what}: not found")
    if status in (401, 403):
        return StorageError(
            f"Azure {what}: {code or status} on container {container!r}; check the account "
            "key, SAS token or connection string"
        )
    if status in RETRIABLE_STATUSES:
        return UnavailableError(f"Azure {what}: {code or status} after retries; try again later")
    if isinstance(exc, az.ServiceRequestError | az.ServiceResponseError):
        return UnavailableError(f"Azure {what}: cannot reach the service: {exc}")
    return StorageError(f"Azure {what}: {code or status}: {exc}")
