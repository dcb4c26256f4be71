"""Options of the ``bookkeeper`` WAL backend (``[wal.bookkeeper]``)."""

from __future__ import annotations

import re
from typing import Final, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from icefloe.ports.base import BackendOptions
from icefloe_wal_bookkeeper.refs import MAX_ENTRY_SIZE, MIN_ENTRY_SIZE

_METADATA_URI: Final = re.compile(r"zk(\+[a-z]+)?://[^/\s;]+(;[^/\s;]+)*(/[^\s]*)?")
_NAMESPACE: Final = re.compile(r"[A-Za-z0-9._/-]{1,128}")


class BookKeeperWALOptions(BackendOptions):
    """Where BookKeeper is, how each WAL object is replicated, how long to wait."""

    metadata_service_uri: str = Field(
        default="zk+hierarchical://127.0.0.1:2181/ledgers",
        description=(
            "The cluster's metadata service, as bookies know it: "
            "zk+<ledger manager>://<zk host:port>[;<host:port>…]/<ledgers root path>."
        ),
    )
    classpath: str = Field(
        default="",
        description=(
            "Apache BookKeeper's client jars (bookkeeper-server 4.17 and its dependencies): "
            "a folder of jars, or jar paths and globs separated by ':'."
        ),
    )
    namespace: str = Field(
        default="icefloe",
        description=(
            "Written into every ledger's metadata; list() (garbage collection) only sees "
            "ledgers of this namespace, so several clusters can share one BookKeeper."
        ),
    )
    ensemble: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Bookies each ledger is written to (with more bookies than this running, "
        "a failed bookie is replaced by an ensemble change).",
    )
    write_quorum: int = Field(default=2, ge=1, le=64, description="Copies of each entry.")
    ack_quorum: int = Field(
        default=2, ge=1, le=64, description="Copies durable before an append returns."
    )
    digest_type: Literal["crc32c", "crc32", "mac", "dummy"] = Field(
        default="crc32c", description="Checksum of every entry (mac: HMAC keyed by password)."
    )
    password: SecretStr = Field(
        default=SecretStr(""),
        description="The ledgers' password: readers must have the writer's.",
    )
    entry_size: int = Field(
        default=1 << 20,
        ge=MIN_ENTRY_SIZE,
        le=MAX_ENTRY_SIZE,
        description="A WAL object is written as entries of at most this many bytes.",
    )
    request_timeout: float = Field(
        default=15.0,
        gt=0,
        le=3600,
        description="Seconds an append, read, delete or listing step may take, then "
        "UnavailableError (retriable); also the client's add and read timeouts.",
    )
    zk_session_timeout: float = Field(
        default=10.0, ge=1, le=600, description="The client's ZooKeeper session timeout."
    )
    max_inflight_bytes: int = Field(
        default=64 << 20,
        ge=1 << 20,
        description="Bytes of appends in flight at once; more appends wait (back-pressure).",
    )
    jvm_max_heap_mb: int = Field(
        default=256,
        ge=64,
        description="-Xmx of the process's JVM, if this WAL starts it (one JVM per process).",
    )
    jvm_max_direct_mb: int = Field(
        default=256,
        ge=64,
        description="-XX:MaxDirectMemorySize of the process's JVM (Netty's buffers).",
    )

    @field_validator("metadata_service_uri")
    @classmethod
    def _zookeeper_uri(cls, uri: str) -> str:
        if _METADATA_URI.fullmatch(uri) is None:
            raise ValueError(
                f"{uri!r} is not a ZooKeeper metadata service URI; expected e.g. "
                "zk+hierarchical://127.0.0.1:2181/ledgers"
            )
        return uri

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, namespace: str) -> str:
        if _NAMESPACE.fullmatch(namespace) is None:
            raise ValueError("namespace must be 1-128 characters of A-Z a-z 0-9 . _ / -")
        return namespace

    @model_validator(mode="after")
    def _quorums(self) -> BookKeeperWALOptions:
        if not self.ack_quorum <= self.write_quorum <= self.ensemble:
            raise ValueError(
                "need ack_quorum <= write_quorum <= ensemble, got "
                f"ack_quorum={self.ack_quorum}, write_quorum={self.write_quorum}, "
                f"ensemble={self.ensemble}"
            )
        return self
