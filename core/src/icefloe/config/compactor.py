"""The ``[compactor]`` configuration section: when streams are compacted into tables."""

from __future__ import annotations

import enum

from pydantic import BaseModel, ConfigDict, Field


class TableCodec(enum.StrEnum):
    """How the record columns of the data files compaction writes are compressed."""

    ZSTD = "zstd"
    """The smallest files; reading them back costs the most CPU."""
    SNAPPY = "snappy"
    """Larger files that decompress faster: cheaper catch-up reads from Parquet."""
    GZIP = "gzip"
    """Small files, slow to write and to read; for readers that know no other codec."""
    NONE = "none"
    """The largest files, with nothing to decompress."""


class CompactorOptions(BaseModel):
    """The planner's thresholds and the table maintenance schedule."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Brokers of `icefloe serve` compact in the background (one of them at a time)."""
    own_process: bool = True
    """Each broker runs its compactor in a process of its own, at a lower CPU priority, so
    that compaction never holds up the broker's clients (it costs the memory of one more
    Python process per broker); false runs it inside the broker's process."""
    interval_s: float = Field(default=5.0, gt=0)
    """How often the compaction leader looks for work."""
    min_age_s: float = Field(default=2.0, ge=0)
    """WAL entries younger than this are left for a later run (they may still be growing)."""
    max_age_s: float = Field(default=30.0, ge=0)
    """A stream is compacted once its oldest WAL entry is this old…"""
    min_bytes: int = Field(default=64 << 20, gt=0)
    """…or once this many WAL bytes wait, whichever comes first. (The topic configs
    ``icefloe.compaction.max.age.ms`` and ``icefloe.compaction.min.bytes`` override both.)"""
    yield_above_cpu: float = Field(default=0.5, ge=0, le=1)
    """While processes other than compaction's keep more than this share of the host's CPU
    busy (0.5: half of all its cores), compaction waits before it plans a run or starts a
    task on the host, so that clients get the cores; 1 never waits. Read from Linux's /proc;
    elsewhere compaction never waits."""
    max_yield_s: float = Field(default=60.0, ge=0)
    """How long compaction waits for a busy host at most: then it goes on until the host is
    seen quiet again, so a burst delays the tables by at most this much."""
    max_task_bytes: int = Field(default=128 << 20, gt=0)
    """WAL bytes one task reads (bounds a worker's memory, about four times this at its peak):
    a task closes once it holds this much, so it may hold up to one WAL object (or one
    stream's chunk) more."""
    max_tasks_per_run: int = Field(default=16, ge=1, le=1024)
    """Tasks one run holds at most. A run's tasks go to the engine together (one Spark job,
    a partition per task) and are committed together: one table commit per format and topic."""
    max_runs_in_flight: int = Field(default=2, ge=1, le=64)
    """Runs planned and not yet committed, at most: the planner waits for one to finish
    before planning more (back-pressure between the planner and the engine)."""
    history_retention_s: float = Field(default=3600.0, gt=0)
    """Table snapshots/versions older than this are expired, so commit cost stays flat, and
    data files taken out of the tables are deleted this long after (topic config
    ``icefloe.table.history.ms``)."""
    expire_every_commits: int = Field(default=20, ge=1)
    rewrite_target_bytes: int = Field(default=128 << 20, ge=0)
    """Table maintenance merges a partition's consecutive small data files (each under three
    quarters of this) into files of up to this size; 0 switches it off (topic config
    ``icefloe.table.rewrite.target.bytes``)."""
    rewrite_min_files: int = Field(default=8, ge=2)
    """How many consecutive small files make a rewrite worth it (topic config
    ``icefloe.table.rewrite.min.files``)."""
    retention_check_interval_s: float = Field(default=300.0, gt=0)
    """How often the compaction leader applies ``retention.ms`` and ``retention.bytes``
    (Kafka's ``log.retention.check.interval.ms``, also five minutes): each check reads every
    partition's index."""
    maintenance_interval_s: float = Field(default=60.0, gt=0)
    """How often the compaction leader looks for small files to merge and files to delete."""
    orphan_sweep_interval_s: float = Field(default=3600.0, gt=0)
    """How often the leader looks for orphaned files (it lists every table's files)."""
    orphan_age_s: float = Field(default=3 * 24 * 3600.0, ge=-1)
    """Files under a table's root that nothing references (no index entry, no table, no
    unfinished task) are deleted once this old; -1 keeps them (topic config
    ``icefloe.table.orphan.age.ms``)."""
    table_compression: TableCodec = TableCodec.ZSTD
    """The codec of the data files' record columns (topic config
    ``icefloe.table.compression``): every Parquet reader knows each of them. Files keep the
    codec they were written with; merges and log compaction write the topic's current one."""
    lease_ttl_s: float = Field(default=10.0, gt=0)
    """The compaction leader's lease; a dead leader is replaced after about this long. A
    leader that cannot renew it stops acting after two thirds of it."""
    set_aside_retry_s: float = Field(default=600.0, gt=0)
    """How long a run that failed three times in a row is set aside before it is tried again
    (doubling with each further failure, up to eight times this); ``icefloe tables retry``
    ends the wait at once."""
