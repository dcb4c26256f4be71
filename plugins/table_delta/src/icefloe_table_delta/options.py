"""Options of the ``delta`` table format (the ``[table.delta]`` table)."""

from __future__ import annotations

from pydantic import Field

from icefloe.ports.base import BackendOptions


class DeltaTableFormatOptions(BackendOptions):
    """How Delta tables are kept. Where they live comes from the object store."""

    log_retention: str = Field(default="interval 7 days", pattern=r"^interval \d+ [a-z]+$")
    """``delta.logRetentionDuration`` of new tables: how long log versions stay after a
    checkpoint (time travel window). ``expire`` never removes versions younger than this."""
    max_workers: int = Field(default=4, ge=1, le=64)
    """Threads running delta-rs calls (its Python API is synchronous)."""
