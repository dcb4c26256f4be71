"""Options of the ``etcd`` metadata backend (``[metadata.etcd]``)."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator

from icefloe.ports.base import BackendOptions


class EtcdMetadataOptions(BackendOptions):
    """Where the etcd cluster is, how to log in, how long to wait."""

    endpoints: list[str] = Field(
        default=["127.0.0.1:2379"],
        min_length=1,
        description=(
            "Client endpoints as host:port (an http:// prefix is accepted); several endpoints "
            "must be IP addresses, tried in order."
        ),
    )
    namespace: str = Field(
        default="icefloe",
        description="Prefix of every key this store writes (keys live under '<namespace>/').",
    )
    username: str | None = Field(default=None, description="etcd user, if auth is enabled.")
    password: SecretStr | None = Field(default=None, description="Password of ``username``.")
    request_timeout: float = Field(
        default=10.0, gt=0, description="Seconds before a request fails with UnavailableError."
    )
    watch_queue_size: int = Field(
        default=10_000,
        ge=1,
        description="Events buffered per watcher; on overflow the watcher gets RESET.",
    )

    @field_validator("endpoints")
    @classmethod
    def _strip_scheme(cls, endpoints: list[str]) -> list[str]:
        return [endpoint.removeprefix("http://") for endpoint in endpoints]

    @field_validator("namespace")
    @classmethod
    def _no_nul(cls, value: str) -> str:
        if "\x00" in value:
            raise ValueError("namespace may not contain NUL")
        return value

    @model_validator(mode="after")
    def _credentials_together(self) -> EtcdMetadataOptions:
        if (self.username is None) != (self.password is None):
            raise ValueError("set both username and password, or neither")
        return self
