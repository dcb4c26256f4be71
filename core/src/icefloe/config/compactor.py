"""The ``[compactor]`` configuration section: when streams are compacted into tables."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CompactorOptions(BaseModel):
    """The planner's thresholds and the table maintenance schedule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Brokers of `icefloe serve` compact in the background (one of them at a time)."""
    interval_s: float = Field(default=5.0, gt=0)
    """How often the compaction leader looks for work."""
    min_age_s: float = Field(default=2.0, ge=0)
    """WAL entries younger than this are left for a later run (they may still be growing)."""
    max_age_s: float = Field(default=30.0, ge=0)
    """A stream is compacted once its oldest WAL entry is this old…"""
    min_bytes: int = Field(default=64 << 20, gt=0)
    """…or once this many WAL bytes wait, whichever comes first. (The topic configs
    ``icefloe.compaction.max.age.ms`` and ``icefloe.compaction.min.bytes`` override both.)"""
    max_task_bytes: int = Field(default=256 << 20, gt=0)
    """WAL bytes one task reads at most (bounds a worker's memory)."""
    history_retention_s: float = Field(default=3600.0, gt=0)
    """Table snapshots/versions older than this are expired, so commit cost stays flat."""
    expire_every_commits: int = Field(default=20, ge=1)
    lease_ttl_s: float = Field(default=10.0, gt=0)
    """The compaction leader's lease; a dead leader is replaced after about this long."""
