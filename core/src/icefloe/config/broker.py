"""The ``[broker]`` configuration section."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]


class BrokerOptions(BaseModel):
    """How a broker process listens, registers itself and treats clients."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(default=9092, ge=0, le=65535)
    """Port of the first broker; with ``--brokers N`` the others take the next N-1 ports."""
    advertised_host: str | None = None
    """Host clients should connect to (default: ``host``)."""
    zone: str | None = None
    """Availability zone of this broker, matched against clients' ``zone_id=`` tokens."""
    node_id: int | None = Field(default=None, ge=0)
    """Fixed broker id; by default one is allocated from the metadata store (a broker restarted
    within its session takes the id its address still holds)."""
    strict_ownership: bool = False
    """Answer NOT_LEADER_OR_FOLLOWER to produce/fetch for partitions another broker owns."""
    auto_create_topics: bool = False
    """Create unknown topics on Metadata requests that allow it (Kafka's auto.create.topics)."""
    default_partitions: int = Field(default=1, ge=1)
    """Partitions of auto-created topics and of CreateTopics requests that leave it to us."""
    max_request_bytes: int = Field(default=100 << 20, gt=0)
    """Largest request frame accepted (Kafka's socket.request.max.bytes); larger closes."""
    max_inflight_requests: int = Field(default=1024, ge=1)
    """Requests per connection decoded ahead of their responses (pipelining). High, because a
    produce waits for its WAL flush (200 ms in the cost profile) and clients pipeline through it."""
    max_inflight_bytes: int = Field(default=64 << 20, gt=0)
    """Bytes one connection's unanswered requests and unsent responses may hold; past it, the
    broker stops reading from the connection until responses go out (back-pressure)."""
    max_memory_bytes: int = Field(default=512 << 20, gt=0)
    """Memory for client data in this broker process: requests and responses in flight over
    every connection, plus what the read caches and the WAL write buffer are configured to
    hold ([storage] wal_cache_bytes, rebuilt_cache_bytes, index_cache_entries, flush_bytes x
    max_inflight_flushes), which come out of it first. When it is spent, the broker reads no
    further requests until responses go out, and fetches return less (back-pressure, never
    growth)."""
    event_loop: EventLoopChoice = "auto"
    """The event loop each broker process runs on: ``uvloop`` (less CPU per request;
    installed with Icefloe except on Windows), ``asyncio`` (the standard library's), or
    ``auto``: uvloop where it is installed, asyncio elsewhere."""
    pin_to_core: bool = True
    """Run each broker process on one core of those it may use (the broker's index-th,
    counting round; Linux), where its threads wake each other without an interrupt between
    cores. Compaction workers and Spark still use every core. ``false`` leaves the brokers
    wherever the kernel puts them (for hosts whose cores are assigned by other means)."""
    session_ttl_s: float = Field(default=10.0, gt=0)
    """How long a dead broker stays listed before its registration expires."""
