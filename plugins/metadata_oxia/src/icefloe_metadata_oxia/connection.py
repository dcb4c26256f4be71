"""The Oxia client protocol over asyncio gRPC: shard discovery, routing, calls, error mapping.

This is what the ``oxia`` Python package does with threads, done on the event loop instead, so
that every call has a deadline and nothing blocks the broker. Shard assignments are streamed
from the service address and kept current by a background task; a request is sent to the
leader of the shard that owns its partition key (``xxh3_64(key)`` truncated to 32 bits, as the
Go client and server compute it).

Writes go through one ``WriteStream`` per shard, in order, as the Go client sends them. Besides
saving a round trip per call, that keeps one process's writes to a shard in sequence: Oxia
v0.14.0 assigns a write's log offset and appends it to its WAL in two steps, and two writes
racing between those steps (separate unary ``Write`` calls do) leave the shard refusing every
later write ("invalid next offset in wal").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc  # type: ignore[import-untyped]  # grpc ships no type information
import xxhash
from google.protobuf.message import Message  # type: ignore[import-untyped]

from icefloe.errors import SessionExpiredError, StorageError, UnavailableError
from icefloe_metadata_oxia._proto import client_pb2 as pb
from icefloe_metadata_oxia.options import OxiaMetadataOptions

_log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=Message)

_SERVICE: Final = "/io.streamnative.oxia.proto.OxiaClient/"
_CHANNEL_OPTIONS: Final = [
    # Reconnect quickly after an outage: the default backoff grows to two minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", 64 << 20),
]
_RETRY_DELAYS: Final = (0.05, 0.1, 0.2, 0.5, 1.0)
"""Backoff of the background streams (assignments, notifications), in seconds."""

# gRPC codes that mean "try again later"; Oxia's own codes (100+) arrive as UNKNOWN and are
# recognised by their message.
_RETRIABLE: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
    }
)
_RETRIABLE_OXIA_ERRORS: Final = (
    "not initialized",
    "not leader",
    "invalid status",
    "invalid term",
    "already closed",
    "operation was cancelled",
)


def backoff_delays() -> Iterator[float]:
    """Delays between attempts of a background stream: short, growing, then steady."""
    yield from _RETRY_DELAYS
    while True:
        yield _RETRY_DELAYS[-1]


def shard_hash(partition_key: str) -> int:
    """The 32-bit hash Oxia routes by (Go: ``uint32(xxh3.HashString(key))``)."""
    return xxhash.xxh3_64_intdigest(partition_key.encode()) & 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Shard:
    id: int
    leader: str
    min_hash: int
    max_hash: int


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn gRPC failures of ``what`` into :mod:`icefloe.errors` types."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, what) from exc


def translate(exc: grpc.aio.AioRpcError, what: str) -> StorageError:
    details = exc.details() or ""
    message = f"Oxia {what} failed: {exc.code().name} {details}".strip()
    if "session not found" in details:
        return SessionExpiredError(message)
    if exc.code() in _RETRIABLE or any(text in details for text in _RETRIABLE_OXIA_ERRORS):
        return UnavailableError(message + "; retry later")
    return StorageError(message)


class OxiaConnection:
    """Channels to the Oxia servers and the current shard map of one Oxia namespace."""

    def __init__(self, options: OxiaMetadataOptions) -> None:
        """Use :meth:`connect`, which waits for the first shard assignments."""
        self.options = options
        self.timeout = options.request_timeout
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._shards: dict[int, Shard] = {}
        self._assigned = asyncio.Event()
        self._assignments_task: asyncio.Task[None] | None = None
        self._writers: dict[tuple[int, str], _ShardWriter] = {}

    @classmethod
    async def connect(cls, options: OxiaMetadataOptions) -> OxiaConnection:
        """Connect and wait for the shard assignments of ``options.oxia_namespace``.

        Raises:
            UnavailableError: no assignments within ``connect_timeout``.
        """
        connection = cls(options)
        connection._assignments_task = asyncio.get_running_loop().create_task(
            connection._follow_assignments(), name="icefloe-oxia-assignments"
        )
        try:
            async with asyncio.timeout(options.connect_timeout):
                await connection._assigned.wait()
        except TimeoutError:
            await connection.close()
            raise UnavailableError(
                f"no Oxia shard assignments from {', '.join(options.addresses)} within "
                f"{options.connect_timeout}s: is the server running? ([metadata.oxia] addresses)"
            ) from None
        except BaseException:
            await connection.close()
            raise
        return connection

    async def close(self) -> None:
        if self._assignments_task is not None:
            self._assignments_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._assignments_task
        writers = list(self._writers.values())
        self._writers.clear()
        for writer in writers:
            await writer.close()
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            await channel.close()

    # --- shards -------------------------------------------------------------------------------

    def shards(self) -> list[Shard]:
        return sorted(self._shards.values(), key=lambda shard: shard.id)

    def shard_for(self, partition_key: str) -> Shard:
        hashed = shard_hash(partition_key)
        for shard in self._shards.values():
            if shard.min_hash <= hashed <= shard.max_hash:
                return shard
        raise UnavailableError(f"no Oxia shard owns hash {hashed:#010x} yet; retry later")

    async def _follow_assignments(self) -> None:
        delays = backoff_delays()
        address_index = 0
        while True:
            address = self.options.addresses[address_index % len(self.options.addresses)]
            request = pb.ShardAssignmentsRequest(namespace=self.options.oxia_namespace)
            call = self._stream(address, "GetShardAssignments", request, pb.ShardAssignments)
            try:
                async for assignments in call:
                    self._apply(assignments)
                    delays = backoff_delays()
            except grpc.aio.AioRpcError as exc:
                _log.debug("Oxia shard assignments from %s: %s", address, exc.code().name)
            except StorageError as exc:  # a namespace we do not serve: log, keep trying
                _log.warning("%s", exc)
            address_index += 1
            await asyncio.sleep(next(delays))

    def _apply(self, assignments: pb.ShardAssignments) -> None:
        namespace = assignments.namespaces.get(self.options.oxia_namespace)
        if namespace is None:
            raise StorageError(
                f"Oxia serves no namespace {self.options.oxia_namespace!r} "
                "([metadata.oxia] oxia_namespace)"
            )
        if namespace.shard_key_router != pb.ShardKeyRouter.XXHASH3:
            raise StorageError(f"unsupported Oxia shard key router {namespace.shard_key_router}")
        self._shards = {
            a.shard: Shard(
                a.shard,
                a.leader,
                a.int32_hash_range.min_hash_inclusive,
                a.int32_hash_range.max_hash_inclusive,
            )
            for a in namespace.assignments
        }
        self._assigned.set()

    # --- calls --------------------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    def _stream(
        self,
        address: str,
        method: str,
        request: Message,
        response: type[_M],
        timeout: float | None = None,
    ) -> grpc.aio.UnaryStreamCall[Any, _M]:
        call = self._channel(address).unary_stream(
            _SERVICE + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        stream: grpc.aio.UnaryStreamCall[Any, _M] = call(request, timeout=timeout)
        return stream

    async def unary(
        self, shard: Shard, method: str, request: Message, response: type[_M], what: str
    ) -> _M:
        """Call ``method`` on ``shard``'s leader with the request timeout."""
        call = self._channel(shard.leader).unary_unary(
            _SERVICE + method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        with translated(what):
            result: _M = await call(request, timeout=self.timeout)
        return result

    async def write(self, shard: Shard, request: pb.WriteRequest, what: str) -> pb.WriteResponse:
        """Send ``request`` on the shard's write stream and wait for its answer."""
        request.shard = shard.id
        writer = self._writers.get((shard.id, shard.leader))
        if writer is None or writer.broken:
            call = self._channel(shard.leader).stream_stream(
                _SERVICE + "WriteStream",
                request_serializer=pb.WriteRequest.SerializeToString,
                response_deserializer=pb.WriteResponse.FromString,
            )(
                metadata=(
                    ("shard-id", str(shard.id)),
                    ("namespace", self.options.oxia_namespace),
                )
            )
            writer = self._writers[(shard.id, shard.leader)] = _ShardWriter(call)
        return await writer.write(request, self.timeout, what)

    async def get(self, shard: Shard, request: pb.GetRequest, what: str) -> pb.GetResponse:
        read = pb.ReadRequest(shard=shard.id, gets=[request])
        with translated(what):
            async for response in self._stream(
                shard.leader, "Read", read, pb.ReadResponse, self.timeout
            ):
                found: pb.GetResponse = response.gets[0]
                return found
        raise UnavailableError(f"Oxia {what}: the server closed the read without an answer")

    async def range_scan(
        self, shard: Shard, start: str, end: str, what: str
    ) -> AsyncIterator[pb.GetResponse]:
        """Records of ``shard`` in ``[start, end)`` in key order; cancelled if not drained."""
        request = pb.RangeScanRequest(shard=shard.id, start_inclusive=start, end_exclusive=end)
        call = self._stream(shard.leader, "RangeScan", request, pb.RangeScanResponse, self.timeout)
        try:
            with translated(what):
                async for response in call:
                    for record in response.records:
                        yield record
        finally:
            call.cancel()

    async def list_keys(self, shard: Shard, start: str, end: str, what: str) -> list[str]:
        request = pb.ListRequest(shard=shard.id, start_inclusive=start, end_exclusive=end)
        keys: list[str] = []
        with translated(what):
            async for response in self._stream(
                shard.leader, "List", request, pb.ListResponse, self.timeout
            ):
                keys.extend(response.keys)
        return keys

    def notifications(
        self, shard: Shard
    ) -> grpc.aio.UnaryStreamCall[pb.NotificationsRequest, pb.NotificationBatch]:
        """The shard's change stream from now on; the first batch only marks the position."""
        # No deadline: the stream lives as long as the watch.
        return self._stream(
            shard.leader,
            "GetNotifications",
            pb.NotificationsRequest(shard=shard.id),
            pb.NotificationBatch,
        )


class _ShardWriter:
    """A shard's write stream: the server answers requests in the order they were sent."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._sending = asyncio.Lock()
        self._waiting: deque[asyncio.Future[pb.WriteResponse]] = deque()
        self.broken = False
        self._reader = asyncio.get_running_loop().create_task(
            self._read_answers(), name="icefloe-oxia-write-stream"
        )

    async def write(self, request: pb.WriteRequest, wait_s: float, what: str) -> pb.WriteResponse:
        answer: asyncio.Future[pb.WriteResponse] = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(wait_s):
                async with self._sending:
                    if self.broken:
                        raise UnavailableError(f"Oxia {what}: the write stream broke; retry")
                    self._waiting.append(answer)
                    try:
                        with translated(what):
                            await self._call.write(request)
                    except BaseException:
                        # Interrupted mid-send: which answer belongs to whom is unknown now.
                        self._break()
                        raise
                # Shielded: the answer stays in line for the reader even if we stop waiting.
                return await asyncio.shield(answer)
        except TimeoutError:
            raise UnavailableError(
                f"Oxia {what}: no answer within {wait_s}s; the write may still be applied"
            ) from None

    def _break(self) -> None:
        self.broken = True
        self._call.cancel()

    async def _read_answers(self) -> None:
        error: StorageError = UnavailableError("Oxia write stream ended; retry")
        try:
            while (response := await self._call.read()) is not grpc.aio.EOF:
                if self._waiting:
                    waiting = self._waiting.popleft()
                    if not waiting.done():
                        waiting.set_result(response)
        except grpc.aio.AioRpcError as exc:
            error = translate(exc, "write")
        except asyncio.CancelledError:
            error = UnavailableError("Oxia connection closed")
            raise
        finally:
            self.broken = True
            while self._waiting:
                waiting = self._waiting.popleft()
                if not waiting.done():
                    waiting.set_exception(error)

    async def close(self) -> None:
        self._break()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
