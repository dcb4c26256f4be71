"""Typed errors shared by every port and adapter.

Adapters translate their SDK's exceptions into these types (raised ``from`` the original), so
core code never needs to know which backend is running. ``retriable`` tells callers whether the
same call may succeed later: the broker maps retriable failures to retriable Kafka errors.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class IcefloeError(Exception):
    """Base class of every error Icefloe raises on purpose."""

    retriable: bool = False


class KafkaError(IcefloeError):
    """A request refused for a reason Kafka has an error code for: ``error_code`` is what the
    client is told, the message is the error message it gets where the protocol carries one.

    Subclasses say where the refusal comes from (a record batch, a topic, a producer); a
    handler answers any of them the same way.
    """

    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


# --- configuration and plugins --------------------------------------------------------------


class ConfigError(IcefloeError):
    """The configuration is invalid; the message names the key and how to fix it."""


class PluginError(IcefloeError):
    """A plugin is broken, missing, or conflicts with another plugin."""


class BackendNotInstalledError(PluginError):
    """A known backend was selected but the distribution that provides it is not installed."""


class DuplicateBackendError(PluginError):
    """Two installed distributions claim the same backend name for the same port."""


class CapabilityError(IcefloeError):
    """An optional capability was used on an adapter that does not declare it."""


# --- storage ports --------------------------------------------------------------------------


class StorageError(IcefloeError):
    """A backend operation failed."""


class NotFoundError(StorageError):
    """The key, object or reference does not exist."""


class ConflictError(StorageError):
    """A conditional write lost: the version did not match or the key already exists."""


class AlreadyExistsError(ConflictError):
    """A create-if-absent write found the key or object already present."""


class UnavailableError(StorageError):
    """The backend cannot be reached or is overloaded; retrying later may succeed."""

    retriable = True


class SessionExpiredError(StorageError):
    """The session behind an ephemeral key has expired; its keys are gone."""


class CorruptDataError(StorageError):
    """Stored or received bytes fail validation (bad magic, checksum, or structure)."""


class LostDataError(StorageError):
    """An object the offset index still references is missing: its records cannot be read."""


class ClosedError(StorageError):
    """The adapter was used after ``close()``."""
