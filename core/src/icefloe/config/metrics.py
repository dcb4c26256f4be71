"""The ``[metrics]`` configuration section: the brokers' operator endpoints."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MetricsOptions(BaseModel):
    """Where each broker of ``icefloe serve`` serves ``/metrics``, ``/livez`` and ``/readyz``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    host: str | None = None
    """Address to listen on (default: ``[broker] host``)."""
    port: int = Field(default=9644, ge=0, le=65535)
    """Port of the first broker's endpoints; with ``--brokers N`` the others take the next
    N-1 ports. 0 picks free ports (``serve`` prints them)."""
    tls: bool = False
    """Serve them over HTTPS with the Kafka listeners' certificate (``[security.tls]``),
    asking scrapers for a client certificate as ``client_auth`` says."""

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"
