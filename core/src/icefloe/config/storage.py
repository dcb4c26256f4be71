"""The ``[storage]`` configuration section: flush profiles, memory limits, grace periods."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator


class FlushProfile(enum.StrEnum):
    COST = "cost"
    """Few, large WAL objects: object-store requests dominate the bill."""
    LATENCY = "latency"
    """Small, frequent WAL objects: the produce acknowledgement comes sooner."""


@dataclass(frozen=True, slots=True)
class ProfileDefaults:
    flush_bytes: int
    flush_interval_s: float
    seal_when_idle: bool
    """Seal the buffer at once while no flush is under way, rather than waiting for the
    interval: the appends that arrive while one flush is written form the next."""
    flush_quiet_s: float | None
    """Seal the buffer once no append has arrived for this long: its producers are waiting
    for answers, not sending."""


PROFILES: Final[dict[FlushProfile, ProfileDefaults]] = {
    FlushProfile.COST: ProfileDefaults(4 << 20, 0.200, seal_when_idle=False, flush_quiet_s=0.010),
    FlushProfile.LATENCY: ProfileDefaults(1 << 20, 0.005, seal_when_idle=True, flush_quiet_s=None),
}
"""What each profile sets where the ``[storage]`` options leave it to the profile."""


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
    seal_when_idle: bool | None = None
    """Seal a WAL object as soon as an append arrives while no flush is under way, instead of
    waiting for ``flush_interval_ms`` (default: from the profile; on for ``latency``)."""
    flush_quiet_ms: float | None = Field(default=None, ge=0)
    """Seal a WAL object once no append has arrived for this long, before its interval ends
    (default: from the profile: 10 for ``cost``; 0 turns it off)."""
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
    """This process's recent WAL objects kept in memory for reads, where the WAL is not on
    this host's files (the local WAL's are read from the kernel's page cache)."""
    rebuilt_cache_bytes: int = Field(default=64 << 20, ge=0)
    """Kafka batches rebuilt from Parquet row groups, kept for the catch-up fetches that
    follow: room for a consumer of 8 partitions to have each one's next 4 row groups (of 1
    MiB) rebuilt ahead."""
    index_cache_entries: int = Field(default=100_000, ge=0)
    """Offset-index entries cached across all streams."""
    commit_deadline_s: float = Field(default=60.0, gt=0)
    """A WAL object older than this is never committed to the index (the produce fails)."""
    producer_lease_s: float = Field(default=10.0, gt=0)
    """How long a broker process may accept an idempotent producer's batches on a partition
    without renewing its lease; after a crash, another process takes over twice this later."""
    orphan_grace_s: float = Field(default=600.0, gt=0)
    """Unreferenced WAL objects older than this are deleted. Must exceed the commit deadline."""
    replaced_wal_reads_s: float = Field(default=300.0, ge=0)
    """For how long after compaction replaced WAL entries this broker has cached a read of
    their records still takes the producer's bytes from the WAL object rather than rebuild
    them from the data file (0: never). At most half of ``orphan_grace_s`` is used: past the
    grace period the objects are deleted, and each read that finds one gone costs a failed
    request."""

    def flush_profile(self, billed_per_append: bool) -> FlushProfile:
        """The profile in force for a WAL that is, or is not, billed per append."""
        if self.profile is not None:
            return self.profile
        return FlushProfile.COST if billed_per_append else FlushProfile.LATENCY

    def flush_bytes_for(self, profile: FlushProfile) -> int:
        return self.flush_bytes or PROFILES[profile].flush_bytes

    def flush_interval_for(self, profile: FlushProfile) -> float:
        """Seconds."""
        if self.flush_interval_ms is not None:
            return self.flush_interval_ms / 1000
        return PROFILES[profile].flush_interval_s

    def flush_quiet_for(self, profile: FlushProfile) -> float | None:
        """Seconds, or None where a quiet spell does not seal."""
        if self.flush_quiet_ms is not None:
            return self.flush_quiet_ms / 1000 or None
        return PROFILES[profile].flush_quiet_s

    def seal_when_idle_for(self, profile: FlushProfile) -> bool:
        if self.seal_when_idle is not None:
            return self.seal_when_idle
        return PROFILES[profile].seal_when_idle

    @property
    def largest_flush_bytes(self) -> int:
        """The flush size of the profile in force, or of the larger profile while it is not
        known yet (for memory budgets)."""
        if self.flush_bytes is not None:
            return self.flush_bytes
        return (
            max(defaults.flush_bytes for defaults in PROFILES.values())
            if self.profile is None
            else PROFILES[self.profile].flush_bytes
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
