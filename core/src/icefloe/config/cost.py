"""The ``[cost]`` configuration section: the prices ``icefloe cost`` applies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CostPrices(BaseModel):
    """Dollar prices; the defaults are Amazon S3 Standard's public list prices (us-east-1)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    put_per_1000: float = Field(default=0.005, ge=0)
    """PUT, COPY, POST and LIST requests (S3 bills LIST as a write-class request)."""
    get_per_1000: float = Field(default=0.0004, ge=0)
    """GET, HEAD and the other read-class requests."""
    delete_per_1000: float = Field(default=0.0, ge=0)
    storage_gb_month: float = Field(default=0.023, ge=0)
    cross_zone_per_gb: float = Field(default=0.02, ge=0)
    """Data crossing availability zones: $0.01 per GB charged on each side."""
