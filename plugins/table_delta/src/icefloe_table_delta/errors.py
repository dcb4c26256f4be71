"""delta-rs exceptions as :mod:`icefloe.errors` types (never leaked to core)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Final

from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from icefloe.errors import (
    ConflictError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.table import TableSpec

LOCATION_GONE: Final = "Invalid table location"
"""How delta-rs's kernel reports a table root that does not exist: delta-rs checks the path
before opening it, so this is a table dropped in between (its topic deleted), not damage."""
NO_SPACE: Final = ("No space left on device", "os error 28")
"""How delta-rs reports a full local disk (ENOSPC) inside its own errors: the store's state,
which freeing space ends, not damage."""
LOG_OUT_OF_STEP: Final = "LogSegment end version"
"""How delta-rs's kernel reports a log listing that disagrees with the version it was asked
for: a listing behind the log (an object store answering a stale listing), which a later
read sees whole, not damage."""


@contextlib.contextmanager
def translated(spec: TableSpec) -> Iterator[None]:
    """Re-raise SDK errors of an operation on ``spec`` as Icefloe errors (``from`` the original).

    Icefloe's own errors and ``ValueError`` (a wrong argument) pass through unchanged.
    """
    name = f"Delta table {spec.location}"
    try:
        yield
    except (IcefloeError, ValueError):
        raise
    except TableNotFoundError as exc:
        raise NotFoundError(f"{name} does not exist") from exc
    except CommitFailedError as exc:
        # Another writer took the log version this commit was based on; nothing was applied.
        # Retrying re-reads the app transaction version, so a retry is always safe.
        raise ConflictError(f"{name}: concurrent commit, retry ({exc})") from exc
    except OSError as exc:
        raise UnavailableError(f"{name}: storage I/O failed ({exc})") from exc
    except DeltaError as exc:
        if LOCATION_GONE in str(exc):
            raise NotFoundError(f"{name} does not exist") from exc
        if any(words in str(exc) for words in NO_SPACE):
            raise UnavailableError(f"{name}: the disk is full ({exc})") from exc
        if LOG_OUT_OF_STEP in str(exc):
            raise UnavailableError(f"{name}: the store listed its log out of step ({exc})") from exc
        raise StorageError(f"{name}: {exc}") from exc
