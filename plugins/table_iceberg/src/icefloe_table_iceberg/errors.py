"""pyiceberg's exceptions as :mod:`icefloe.errors` types (never leaked to core)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchNamespaceError,
    NoSuchTableError,
    RESTError,
    ServerError,
    ServiceUnavailableError,
    TooManyRequestsError,
    ValidationException,
)

from icefloe.errors import (
    ConflictError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.table import TableSpec


@contextlib.contextmanager
def translated(spec: TableSpec) -> Iterator[None]:
    """Re-raise SDK errors of an operation on ``spec`` as Icefloe errors (``from`` the original).

    Icefloe's own errors and ``ValueError`` (a wrong argument) pass through unchanged.
    """
    name = f"Iceberg table {spec.identifier}"
    try:
        yield
    except (IcefloeError, ValueError):
        raise
    except (NoSuchTableError, NoSuchNamespaceError) as exc:
        raise NotFoundError(f"{name} does not exist") from exc
    except (CommitFailedException, ValidationException) as exc:
        # Another writer moved the table between our read and our commit; nothing was
        # applied. Retrying re-reads the commit sequence, so a retry is always safe.
        raise ConflictError(f"{name}: concurrent commit, retry ({exc})") from exc
    except CommitStateUnknownException as exc:
        # The commit may or may not have landed: the retry's sequence check tells which.
        raise UnavailableError(f"{name}: commit outcome unknown, retry ({exc})") from exc
    except (ServiceUnavailableError, ServerError, TooManyRequestsError) as exc:
        raise UnavailableError(f"{name}: the catalog is unavailable ({exc})") from exc
    except FileNotFoundError as exc:
        raise NotFoundError(f"{name}: {exc}") from exc
    except (ConnectionError, TimeoutError) as exc:
        raise UnavailableError(f"{name}: the catalog cannot be reached ({exc})") from exc
    except RESTError as exc:
        raise StorageError(f"{name}: the catalog refused the request ({exc})") from exc
    except OSError as exc:
        raise UnavailableError(f"{name}: storage I/O failed ({exc})") from exc
    except Exception as exc:
        if _is_unreachable(exc):
            raise UnavailableError(f"{name}: the catalog cannot be reached ({exc})") from exc
        raise StorageError(f"{name}: {type(exc).__name__}: {exc}") from exc


def _is_unreachable(exc: Exception) -> bool:
    """A connection failure of requests (REST) or SQLAlchemy (SQL), without importing either."""
    kinds = {f"{c.__module__}.{c.__name__}" for c in type(exc).__mro__}
    return bool(
        kinds
        & {
            "requests.exceptions.ConnectionError",
            "requests.exceptions.Timeout",
            "sqlalchemy.exc.OperationalError",
        }
    )
