"""How delta-rs's errors reach core: as the Icefloe error that says what happened."""

from __future__ import annotations

import pytest
from deltalake.exceptions import DeltaError, TableNotFoundError
from icefloe_table_delta.errors import translated

from icefloe.errors import NotFoundError, StorageError, UnavailableError
from icefloe.ports.table import TableSpec
from icefloe.storage.row_schema import ROW_SCHEMA

SPEC = TableSpec("icefloe", "events", "file:///t/events", ROW_SCHEMA, "file:///t/meta/events")


def test_a_table_root_that_vanished_while_opened_is_not_found() -> None:
    """delta-rs checks the path, then its kernel opens it: a table dropped in between (its
    topic deleted) is reported as an invalid location, which is a table that is not there."""
    with pytest.raises(NotFoundError), translated(SPEC):
        raise DeltaError('Kernel error: Invalid table location: Path does not exist: "/t/"')


def test_a_missing_table_is_not_found_and_other_failures_are_storage_errors() -> None:
    with pytest.raises(NotFoundError), translated(SPEC):
        raise TableNotFoundError("no log files")
    with pytest.raises(StorageError) as caught, translated(SPEC):
        raise DeltaError("Kernel error: File not found: _delta_log/00000000000000000003.json")
    assert not isinstance(caught.value, NotFoundError)


def test_a_log_listed_out_of_step_is_unavailable_for_now() -> None:
    """A stale listing of the log (a version written, not listed yet) is the store's, and a
    later try sees the log whole: retriable, not damage."""
    with pytest.raises(UnavailableError) as caught, translated(SPEC):
        raise DeltaError(
            "Generic delta kernel error: LogSegment end version 2 not the same as the "
            "specified end version 3"
        )
    assert caught.value.retriable


def test_a_full_disk_is_unavailable_for_now() -> None:
    with pytest.raises(UnavailableError, match="disk is full") as caught, translated(SPEC):
        raise DeltaError("Failed to write: No space left on device (os error 28)")
    assert caught.value.retriable
