"""The ``[storage]`` configuration section: flush profiles, memory limits, grace periods."""

from __future__ import annotations

import enum
from typing import Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FlushProfile(enum.StrEnum):
    COST = "cost"
    """Few, large WAL objects: object-store requests dominate the bill."""
    LATENCY = "latency"
    """Small, frequent WAL objects: the produce acknowledgement comes sooner."""


PROFILES: Final[dict[FlushProfile, tuple[int, float]]] = {
    FlushProfile.COST: (4 << 20, 0.200),
    FlushProfile.LATENCY: (1 << 20, 0.005),
}
"""(flush size in bytes, flush interval in seconds) of each profile."""


class StorageOptions(BaseModel):
    """How the stream storage engine buffers, caches and cleans up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: FlushProfile | None = None
    """``cost`` or ``latency``. By default ``cost`` where every WAL append is a billed request
    (S3, GCS, Azure), ``latency`` where it is not (the local store)."""
    flush_bytes: int | None = Field(default=None, gt=0)
    """Seal a WAL object once this many bytes are buffered (default: from the profile)."""
    flush_interval_ms: float | None = Field(default=None, gt=0)
    """Seal a WAL object at most this long after its first append (default: from the profile)."""
    max_buffered_bytes: int = Field(default=64 << 20, gt=0)
    """Bytes accepted but not yet committed; past it, appends wait (back-pressure)."""
    max_inflight_flushes: int = Field(default=4, ge=1)
    max_batch_bytes: int = Field(default=1 << 20, gt=0)
    """Largest record batch accepted (Kafka's ``message.max.bytes``); a topic's
    ``max.message.bytes`` overrides it, up to ``max_topic_batch_bytes``."""
    max_topic_batch_bytes: int = Field(default=16 << 20, gt=0)
    """The most a topic's ``max.message.bytes`` may be: every batch up to it is held whole in
    memory until its WAL object is durable."""
    wal_cache_bytes: int = Field(default=64 << 20, ge=0)
    """This process's recent WAL objects kept in memory for reads."""
    rebuilt_cache_bytes: int = Field(default=32 << 20, ge=0)
    """Kafka batches rebuilt from Parquet row groups, kept for the catch-up fetches that
    follow."""
    index_cache_entries: int = Field(default=100_000, ge=0)
    """Offset-index entries cached across all streams."""
    commit_deadline_s: float = Field(default=60.0, gt=0)
    """A WAL object older than this is never committed to the index (the produce fails)."""
    producer_lease_s: float = Field(default=10.0, gt=0)
    """How long a broker process may accept an idempotent producer's batches on a partition
    without renewing its lease; after a crash, another process takes over twice this later."""
    orphan_grace_s: float = Field(default=600.0, gt=0)
    """Unreferenced WAL objects older than this are deleted. Must exceed the commit deadline."""

    def flush_profile(self, billed_per_append: bool) -> FlushProfile:
        """The profile in force for a WAL that is, or is not, billed per append."""
        if self.profile is not None:
            return self.profile
        return FlushProfile.COST if billed_per_append else FlushProfile.LATENCY

    def flush_bytes_for(self, profile: FlushProfile) -> int:
        return self.flush_bytes or PROFILES[profile][0]

    def flush_interval_for(self, profile: FlushProfile) -> float:
        """Seconds."""
        if self.flush_interval_ms is not None:
            return self.flush_interval_ms / 1000
        return PROFILES[profile][1]

    @property
    def largest_flush_bytes(self) -> int:
        """The flush size of the profile in force, or of the larger profile while it is not
        known yet (for memory budgets)."""
        if self.flush_bytes is not None:
            return self.flush_bytes
        return (
            max(size for size, _ in PROFILES.values())
            if self.profile is None
            else (PROFILES[self.profile][0])
        )

    @model_validator(mode="after")
    def _batch_limits_fit(self) -> Self:
        if not self.max_batch_bytes <= self.max_topic_batch_bytes <= self.max_buffered_bytes:
            raise ValueError(
                f"max_batch_bytes ({self.max_batch_bytes}) <= max_topic_batch_bytes "
                f"({self.max_topic_batch_bytes}) <= max_buffered_bytes "
                f"({self.max_buffered_bytes}) must hold"
            )
        return self

    @model_validator(mode="after")
    def _grace_exceeds_deadline(self) -> Self:
        # The orphan collector relies on it: a WAL object older than the grace period can no
        # longer gain an index entry.
        if self.orphan_grace_s <= self.commit_deadline_s:
            raise ValueError(
                f"orphan_grace_s ({self.orphan_grace_s}) must exceed "
                f"commit_deadline_s ({self.commit_deadline_s})"
            )
        return self
