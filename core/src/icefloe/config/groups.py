"""The ``[groups]`` configuration section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class GroupOptions(BaseModel):
    """How the group coordinator treats consumer groups (Kafka's ``group.*`` broker configs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_session_timeout_ms: int = Field(default=6_000, ge=1)
    """Smallest session timeout a classic member may ask for (``group.min.session.timeout.ms``)."""
    max_session_timeout_ms: int = Field(default=1_800_000, ge=1)
    """Largest session timeout a classic member may ask for (``group.max.session.timeout.ms``)."""
    initial_rebalance_delay_ms: int = Field(default=3_000, ge=0)
    """Longest wait of the first rebalance of an empty classic group for more members."""
    initial_rebalance_quiet_ms: int = Field(default=300, ge=0)
    """The first rebalance of an empty classic group starts once no new member has joined for
    this long, within ``initial_rebalance_delay_ms`` (equal values: Kafka's fixed delay)."""
    consumer_session_timeout_ms: int = Field(default=45_000, ge=1)
    """KIP-848 session timeout, decided by the broker (``group.consumer.session.timeout.ms``)."""
    consumer_heartbeat_interval_ms: int = Field(default=5_000, ge=1)
    """KIP-848 heartbeat interval told to members (``group.consumer.heartbeat.interval.ms``)."""
    consumer_assignors: tuple[str, ...] = ("uniform", "range")
    """Server-side assignors members may choose; the first is the default."""
    offset_metadata_max_bytes: int = Field(default=4096, ge=0)
    """Longest metadata string stored with a committed offset (``offset.metadata.max.bytes``)."""
