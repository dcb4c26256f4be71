"""The ``[schema_registry]`` configuration section: the registry the brokers serve, or the
external one they use instead."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator


class SchemaRegistryOptions(BaseModel):
    """Where each broker of ``icefloe serve`` serves the Confluent-compatible schema registry
    API, or, with ``url``, which external registry Icefloe reads schemas from instead."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    host: str | None = None
    """Address to listen on (default: ``[broker] host``)."""
    port: int = Field(default=8081, ge=0, le=65535)
    """Port of the first broker's registry; with ``--brokers N`` the others take the next
    N-1 ports. 0 picks free ports (``serve`` prints them)."""
    tls: bool = False
    """Serve it over HTTPS with the Kafka listeners' certificate (``[security.tls]``)."""
    url: str | None = None
    """An external Confluent-compatible registry (``http://…`` or ``https://…``): Icefloe reads
    schemas from it and serves no registry of its own."""
    basic_auth_user_info: SecretStr | None = None
    """``user:password`` for the external registry's HTTP basic authentication."""

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        return url.rstrip("/") if url else url

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def served(self) -> bool:
        """Whether the brokers serve a registry (enabled, and no external one configured)."""
        return self.enabled and self.url is None
