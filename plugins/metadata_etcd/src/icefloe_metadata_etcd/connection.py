"""One gRPC channel to etcd, with the login token and error mapping every call shares.

The requests are built from the ``aetcd`` package's generated etcd v3 messages and stubs; its
high-level client is not used because the adapter needs what it does not expose: range limits
and sort order, arbitrary transactions, and watches resumed from a revision.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

import grpc  # type: ignore[import-untyped]  # grpc ships no type information
from aetcd import rpc  # type: ignore[import-untyped]

from icefloe.errors import SessionExpiredError, StorageError, UnavailableError
from icefloe_metadata_etcd.options import EtcdMetadataOptions

_CHANNEL_OPTIONS: Final = [
    # Reconnect quickly after an outage: the default backoff grows to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
_RETRIABLE: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
    }
)


def target(endpoints: list[str]) -> str:
    """A gRPC target for ``endpoints``: one address, or a pick-first list of IP addresses."""
    if len(endpoints) == 1:
        return endpoints[0]
    return "ipv4:" + ",".join(endpoints)


def translate(exc: grpc.aio.AioRpcError, what: str) -> StorageError:
    details = exc.details() or ""
    message = f"etcd {what} failed: {exc.code().name} {details}".strip()
    if "lease not found" in details:
        return SessionExpiredError(message)
    if exc.code() in _RETRIABLE or "leader changed" in details or "no leader" in details:
        return UnavailableError(message + "; retry later")
    return StorageError(message)


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn gRPC failures of ``what`` into :mod:`icefloe.errors` types."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, what) from exc


class EtcdConnection:
    """The channel, the stubs and the auth token."""

    def __init__(self, options: EtcdMetadataOptions) -> None:
        """Use :meth:`connect`."""
        self.options = options
        self.timeout = options.request_timeout
        self.channel = grpc.aio.insecure_channel(
            target(options.endpoints), options=_CHANNEL_OPTIONS
        )
        self.kv = rpc.KVStub(self.channel)
        self.leases = rpc.LeaseStub(self.channel)
        self.watches = rpc.WatchStub(self.channel)
        self.metadata: tuple[tuple[str, str], ...] = ()

    @classmethod
    async def connect(cls, options: EtcdMetadataOptions) -> EtcdConnection:
        """Open the channel and check that etcd answers (logging in first if configured).

        Raises:
            UnavailableError: etcd did not answer within ``request_timeout``.
        """
        connection = cls(options)
        try:
            await connection.authenticate()
            await connection.call(
                connection.kv.Range, rpc.RangeRequest(key=b"\x00", limit=1), "connect"
            )
        except BaseException:
            await connection.close()
            raise
        return connection

    async def authenticate(self) -> None:
        if self.options.username is None or self.options.password is None:
            return
        request = rpc.AuthenticateRequest(
            name=self.options.username, password=self.options.password.get_secret_value()
        )
        with translated("login"):
            response = await rpc.AuthStub(self.channel).Authenticate(request, timeout=self.timeout)
        self.metadata = (("token", response.token),)

    async def call(self, method: Any, request: Any, what: str) -> Any:
        """Call a unary ``method`` with the timeout and token; log in again once if needed."""
        try:
            return await method(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAUTHENTICATED or not self.metadata:
                raise translate(exc, what) from exc
        await self.authenticate()  # tokens expire; a fresh one is one login away
        with translated(what):
            return await method(request, timeout=self.timeout, metadata=self.metadata)

    async def close(self) -> None:
        await self.channel.close()
