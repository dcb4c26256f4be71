"""Options of the ``oxia`` metadata backend (``[metadata.oxia]``)."""

from __future__ import annotations

from pydantic import Field, field_validator

from icefloe.ports.base import BackendOptions


class OxiaMetadataOptions(BackendOptions):
    """Where the Oxia cluster is and how long to wait for it."""

    addresses: list[str] = Field(
        default=["127.0.0.1:6648"],
        min_length=1,
        description="Oxia service addresses (host:port); shard leaders are discovered from them.",
    )
    namespace: str = Field(
        default="icefloe",
        description=(
            "Prefix of every key this store writes, so that several clusters (or tests) share "
            "one Oxia namespace; may contain '/'. Empty means the root."
        ),
    )
    oxia_namespace: str = Field(
        default="default",
        description="The Oxia namespace (the standalone server serves only 'default').",
    )
    request_timeout: float = Field(
        default=10.0, gt=0, description="Seconds before a request fails with UnavailableError."
    )
    connect_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds open() waits for the shard assignments before UnavailableError.",
    )
    watch_queue_size: int = Field(
        default=10_000,
        ge=1,
        description="Events buffered per watcher; on overflow the watcher gets RESET.",
    )

    @field_validator("namespace")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("namespace may not contain NUL")
        return value
