"""The ``[quotas]`` configuration section: how a broker measures clients against their quotas.

The quotas themselves are set at run time over the Kafka protocol (AlterClientQuotas, as
``kafka-configs --alter --entity-type users --add-config producer_byte_rate=…`` sends it) and
kept in the metadata store; these settings only say how usage is measured, as Kafka's
``quota.window.num`` and ``quota.window.size.seconds`` do.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class QuotaOptions(BaseModel):
    """Rate measurement for client quotas (Kafka's ``quota.window.*`` broker configs)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_num: int = Field(default=11, ge=2, le=100)
    """Samples a rate is measured over (``quota.window.num``): the current one and the
    whole ones before it."""
    window_size_s: float = Field(default=1.0, ge=0.01, le=3600)
    """Length of each sample, in seconds (``quota.window.size.seconds``; Kafka takes whole
    seconds, a fraction here makes throttling finer and more frequent)."""
    max_tracked: int = Field(default=10_000, ge=1, le=10_000_000)
    """Rates a broker tracks at most (one per quota and user, client id or pair that a quota
    measures); past it the least recently used is forgotten, so a client that keeps changing
    its client id cannot grow the broker's memory."""
