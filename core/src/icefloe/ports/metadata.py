"""The MetadataStore port: a versioned, ordered key-value store.

Contract (the suite in ``icefloe.testing.metadata_contract`` is its executable form):

Keys and values
    Keys are non-empty ``str`` of at most 1024 UTF-8 bytes, ordered by their UTF-8 bytes
    (the same as code-point order), and may not contain NUL. They are ``/``-separated paths;
    an adapter may shard by the parent path (everything up to the last ``/``), so keys that
    must be sequenced together share a parent. Values are ``bytes`` of at most 1 MiB.

Versions
    Every successful write gives the key a new positive integer version, greater than any
    version the key had before. ``put`` and ``delete`` accept ``expected_version``: an int
    (the write succeeds only if the key currently has exactly that version) or
    :data:`MUST_NOT_EXIST`. A failed condition raises :class:`~icefloe.errors.ConflictError`
    and changes nothing.

Ordered reads
    ``scan(start, end)`` returns records with ``start <= key < end`` in key order.
    ``floor(key)`` is the record with the greatest key ``<= key``; ``ceiling(key)`` the one
    with the least key ``>= key``.

Sequenced append
    ``append_sequence(prefix, value, deltas)`` atomically writes ``value`` under the next key of
    the sequence named by ``prefix``: ``prefix`` followed by ``-%020d`` for each component,
    where each component is the previous highest key's component plus its delta (previous
    components are 0 when the sequence is empty). The first delta must be positive and the
    others non-negative, so keys of one sequence strictly increase. Concurrent appends from any
    number of processes yield a gapless, duplicate-free sequence. This is Oxia's sequence-key
    format; other adapters reproduce it. Every append to one sequence passes the same number
    of deltas (a different number is a ``ValueError`` where the adapter can tell), and callers
    keep no other keys starting with ``prefix-``. ``append_sequences`` makes several such
    appends at once, each standing on its own (one may fail while the others land); an adapter
    may commit them together.

Notifications
    ``watch(prefix)`` yields a :class:`WatchEvent` for every later change to a key starting with
    ``prefix``, in commit order. It never silently misses a change: if events were lost (a
    buffer overflowed, history was compacted, a connection dropped) it yields one ``RESET``
    event, after which the watcher must re-read what it cares about. Events carry no values;
    a PUT event's version is the record's new version, a DELETE event's version is
    adapter-defined (it may be ``None``).

Sessions
    ``open_session(ttl)`` starts a session kept alive by the adapter in the background. Keys
    written with ``session=`` are ephemeral: they are deleted when the session is closed or,
    if its holder dies or stalls, within ``ttl`` seconds plus the adapter's reaping delay.
    Writing an ephemeral key again without ``session=`` makes it permanent.
    The adapter renews the session at least every third of the ttl, counted from when the
    keep-alive before was sent, not answered (a server's adapter every sixth:
    :meth:`Session.until_keep_alive`).
    ``Session.lost`` completes when the adapter learns the session expired, and at the latest
    ``ttl`` seconds after the last keep-alive the server answered was *sent*
    (``Session.renewed_at``): past that the server may have expired it, so a holder must not
    go on acting on it. A holder that must stop before anyone else can take over (a leader)
    stops earlier, at :meth:`Session.holds_until`.

Capabilities
    ``MULTI_KEY_TRANSACTION``: :meth:`MetadataStore.transact` applies checks and writes on
    several keys atomically, up to ``TRANSACTION_WRITES`` writes at a time at the least. Core
    works without it.

Errors
    Adapters raise only :mod:`icefloe.errors` types; an unreachable server is
    :class:`~icefloe.errors.UnavailableError` (retriable).

Metrics
    The public methods time every call and count the ones that fail (a compare-and-set that
    loses is an answer, not a failure), so each adapter is measured alike.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Self

from icefloe import metrics
from icefloe.errors import ConfigError, ConflictError
from icefloe.ports.base import Port, PortKind

_log = logging.getLogger(__name__)

MUST_NOT_EXIST: Final = -1
"""``expected_version`` meaning "the key must not exist"."""

MAX_KEY_BYTES: Final = 1024
MAX_VALUE_BYTES: Final = 1 << 20
SCAN_PAGE: Final = 1000
"""Records :meth:`MetadataStore.scan_all` reads per request."""
TRANSACTION_WRITES: Final = 64
"""Writes an adapter with ``MULTI_KEY_TRANSACTION`` takes in one :meth:`MetadataStore.transact`
at the least (etcd's default limit is 128 operations)."""
SEQUENCE_COMPONENT_WIDTH: Final = 20
KEEP_ALIVES_PER_TTL: Final = 6
"""How many keep-alives a session on a server sends per ttl, each that long after the one before
was sent (or as soon as it is answered, if later). A holder that stops at two thirds of the ttl
(the compaction leader, :meth:`Session.holds_until`) then keeps proving its session as long as
each keep-alive is answered within half the ttl; one sent a third of the ttl after the last
answer left it a third of the ttl for two round trips, which a busy server or host exceeds."""


_OPS: Final = (
    "get",
    "put",
    "delete",
    "delete_range",
    "scan",
    "floor",
    "ceiling",
    "append_sequence",
    "open_session",
    "transact",
)
# Bound once: a failure counter that exists from the start reads 0 rather than being absent.
_SECONDS: Final = {op: metrics.METADATA_SECONDS.labels(op) for op in _OPS}
_FAILURES: Final = {op: metrics.METADATA_FAILURES.labels(op) for op in _OPS}


class _Measured:
    """``with _Measured(op):`` times a store operation and counts it if it fails. A class, not
    a generator-based context manager: every index append and look-up goes through one."""

    __slots__ = ("_op", "_started")

    def __init__(self, op: str) -> None:
        self._op = op
        self._started = time.perf_counter()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        _observe(self._op, time.perf_counter() - self._started, exc)


def _observe(op: str, seconds: float, outcome: object) -> None:
    """Count one call of ``op`` that took ``seconds``, and its failure if ``outcome`` is one."""
    # A conflict is an answer (the condition did not hold), not a failure of the store.
    if isinstance(outcome, Exception) and not isinstance(outcome, ConflictError):
        _FAILURES[op].inc()
    _SECONDS[op].observe(seconds)


@dataclass(frozen=True, slots=True)
class SequenceAppend:
    """One append of :meth:`MetadataStore.append_sequences`."""

    prefix: str
    value: bytes
    deltas: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Record:
    """A key's current value and version."""

    key: str
    value: bytes
    version: int


class EventKind(enum.StrEnum):
    PUT = "put"
    DELETE = "delete"
    RESET = "reset"


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change seen by a watcher. ``key`` and ``version`` are ``None`` for ``RESET``."""

    kind: EventKind
    key: str | None = None
    version: int | None = None


RESET: Final = WatchEvent(EventKind.RESET)


@dataclass(frozen=True, slots=True)
class Check:
    """A transaction condition: ``key`` has ``version`` (or :data:`MUST_NOT_EXIST`)."""

    key: str
    version: int


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


class Watch(abc.ABC):
    """A stream of :class:`WatchEvent`; an async iterator and an async context manager.

    The watch is established when :meth:`MetadataStore.watch` returns: every change committed
    after that is delivered (or covered by a ``RESET``).
    """

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> WatchEvent:
        event = await self.next_event()
        if event is None:
            raise StopAsyncIteration
        return event

    @abc.abstractmethod
    async def next_event(self) -> WatchEvent | None:
        """Wait for the next event; ``None`` once the watch is closed."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop watching and release resources; idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


class Session(abc.ABC):
    """A liveness session owning ephemeral keys; an async context manager."""

    id: str
    ttl: float
    renewed_at: float
    """When (``time.monotonic()``) the last keep-alive the server answered was sent, or the
    session was opened: the server holds the session until ``renewed_at + ttl`` at least."""

    def holds_until(self, fraction: float = 1.0) -> float:
        """The ``time.monotonic()`` until which this holder knows the session holds, with only
        ``fraction`` of the ttl counted (a margin for the clocks' rates and a write under way)."""
        return self.renewed_at + self.ttl * fraction

    def remaining(self) -> float:
        """Seconds left before the session may have expired on the server (``<= 0``: it may
        have); adapters bound their keep-alives by it."""
        return self.holds_until() - time.monotonic()

    def until_keep_alive(self, last_sent: float) -> float:
        """Seconds an adapter waits before the keep-alive that follows one sent at
        ``last_sent`` (:data:`KEEP_ALIVES_PER_TTL`), never past the session's end."""
        due = last_sent + self.ttl / KEEP_ALIVES_PER_TTL - time.monotonic()
        return max(0.0, min(due, self.remaining()))

    @property
    @abc.abstractmethod
    def lost(self) -> asyncio.Future[None]:
        """Completes when the session has expired or was closed."""

    @property
    def alive(self) -> bool:
        return not self.lost.done()

    @abc.abstractmethod
    async def close(self) -> None:
        """End the session now, deleting its ephemeral keys; idempotent."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()


def sequence_key(prefix: str, components: Sequence[int]) -> str:
    """The key of a sequence entry: ``prefix`` then ``-%020d`` per component."""
    return prefix + "".join(f"-{c:0{SEQUENCE_COMPONENT_WIDTH}d}" for c in components)


def sequence_components(prefix: str, key: str) -> tuple[int, ...]:
    """Parse the components of a key written by :meth:`MetadataStore.append_sequence`."""
    suffix = key[len(prefix) :]
    if not key.startswith(prefix) or not suffix.startswith("-"):
        raise ValueError(f"{key!r} is not a key of sequence {prefix!r}")
    return tuple(int(part) for part in suffix[1:].split("-"))


def sequence_upper_bound(prefix: str) -> str:
    """A key greater than every key of the sequence ``prefix`` and less than ``prefix + "."``.

    ``floor(sequence_upper_bound(p))`` finds the sequence's last entry (then check its prefix).
    """
    return prefix + "-~"


def validate_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"metadata key must be a non-empty str, got {key!r}")
    if "\x00" in key:
        raise ValueError(f"metadata key may not contain NUL: {key!r}")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise ValueError(f"metadata key longer than {MAX_KEY_BYTES} bytes: {key[:40]!r}…")


def _validate_value(value: bytes) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"metadata value must be bytes, got {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueError(f"metadata value of {len(value)} bytes exceeds {MAX_VALUE_BYTES}")


def _validated_append(prefix: str, value: bytes, deltas: Sequence[int]) -> tuple[int, ...]:
    """The deltas of a valid sequence append, as a tuple."""
    validate_key(prefix)
    _validate_value(value)
    deltas = tuple(deltas)
    if not deltas or deltas[0] <= 0 or any(d < 0 for d in deltas[1:]):
        raise ValueError(
            f"sequence deltas must be one positive delta then non-negative ones, got {deltas}"
        )
    return deltas


def _validate_expected(expected_version: int | None) -> None:
    if expected_version is not None and (
        not isinstance(expected_version, int)
        or (expected_version <= 0 and expected_version != MUST_NOT_EXIST)
    ):
        raise ValueError(
            "expected_version must be a positive version or MUST_NOT_EXIST, "
            f"got {expected_version!r}"
        )


class MetadataStore(Port):
    """Versioned, ordered key-value store with sequences, notifications and sessions.

    See the module docstring for the full contract.
    """

    kind: ClassVar[PortKind] = PortKind.METADATA
    MULTI_KEY_TRANSACTION: ClassVar[str] = "multi_key_transaction"

    # --- public API: validates, then calls the adapter's primitive ---------------------------

    async def get(self, key: str) -> Record | None:
        """The record at ``key``, or ``None``."""
        validate_key(key)
        with _Measured("get"):
            return await self._get(key)

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        expected_version: int | None = None,
        session: Session | None = None,
    ) -> Record:
        """Write ``value`` at ``key`` and return the new record.

        Args:
            key: The key.
            value: The new value.
            expected_version: ``None`` to write unconditionally, a version the key must have,
                or :data:`MUST_NOT_EXIST`.
            session: Make the key ephemeral, owned by this session.

        Raises:
            ConflictError: ``expected_version`` did not match.
            SessionExpiredError: ``session`` is no longer alive.
        """
        validate_key(key)
        _validate_value(value)
        _validate_expected(expected_version)
        with _Measured("put"):
            return await self._put(key, value, expected_version, session)

    async def delete(self, key: str, *, expected_version: int | None = None) -> bool:
        """Delete ``key``; ``True`` if it existed.

        Raises:
            ConflictError: ``expected_version`` was given and did not match (including when the
                key is absent).
        """
        validate_key(key)
        _validate_expected(expected_version)
        if expected_version == MUST_NOT_EXIST:
            raise ValueError("delete with expected_version=MUST_NOT_EXIST makes no sense")
        with _Measured("delete"):
            return await self._delete(key, expected_version)

    async def delete_range(self, start: str, end: str) -> None:
        """Delete every key with ``start <= key < end`` (not atomic across shards)."""
        validate_key(start)
        validate_key(end)
        with _Measured("delete_range"):
            await self._delete_range(start, end)

    async def scan(self, start: str, end: str, *, limit: int | None = None) -> list[Record]:
        """Records with ``start <= key < end`` in key order, at most ``limit`` of them."""
        validate_key(start)
        validate_key(end)
        if limit is not None and limit <= 0:
            raise ValueError(f"limit must be positive, got {limit}")
        if start >= end:
            return []
        with _Measured("scan"):
            return await self._scan(start, end, limit)

    async def scan_all(
        self, start: str, end: str, *, page: int = SCAN_PAGE
    ) -> AsyncIterator[Record]:
        """Every record with ``start <= key < end``, in key order, read ``page`` at a time so
        that a long range never sits in memory whole."""
        while True:
            records = await self.scan(start, end, limit=page)
            for record in records:
                yield record
            if len(records) < page:
                return
            start = records[-1].key + "\x01"  # the least key after it (keys hold no NUL)

    async def floor(self, key: str) -> Record | None:
        """The record with the greatest key ``<= key``."""
        validate_key(key)
        with _Measured("floor"):
            return await self._floor(key)

    async def ceiling(self, key: str) -> Record | None:
        """The record with the least key ``>= key``."""
        validate_key(key)
        with _Measured("ceiling"):
            return await self._ceiling(key)

    async def append_sequence(self, prefix: str, value: bytes, deltas: Sequence[int]) -> Record:
        """Append ``value`` under the next key of sequence ``prefix``; see the module contract."""
        deltas = _validated_append(prefix, value, deltas)
        with _Measured("append_sequence"):
            return await self._append_sequence(prefix, value, deltas)

    async def append_sequences(
        self, appends: Sequence[SequenceAppend]
    ) -> list[Record | BaseException]:
        """Make several :meth:`append_sequence` calls at once. Each stands on its own: the
        outcome of each, in order, is its record or the exception it raised.

        Raises:
            ValueError: an append is malformed (nothing was appended).
        """
        appends = [
            SequenceAppend(a.prefix, a.value, _validated_append(a.prefix, a.value, a.deltas))
            for a in appends
        ]
        started = time.perf_counter()
        outcomes = await self._append_sequences(appends)
        # Measured as the appends they are: each took as long as the lot.
        elapsed = time.perf_counter() - started
        for outcome in outcomes:
            _observe("append_sequence", elapsed, outcome)
        return outcomes

    def watch(self, prefix: str = "") -> _WatchOpener:
        """Watch changes to keys starting with ``prefix``.

        Use as ``async with store.watch(p) as w: async for event in w: ...`` or
        ``w = await store.watch(p)``; the watch is established once either returns.
        """
        if not isinstance(prefix, str) or "\x00" in prefix:
            raise ValueError(f"watch prefix must be a str without NUL, got {prefix!r}")
        return _WatchOpener(self._watch(prefix))

    async def open_session(self, ttl: float = 10.0) -> Session:
        """Start a session whose ephemeral keys vanish ``ttl`` seconds after its holder dies."""
        if not 0.1 <= ttl <= 3600:
            raise ConfigError(f"session ttl must be between 0.1 and 3600 seconds, got {ttl}")
        with _Measured("open_session"):
            return await self._open_session(ttl)

    async def transact(self, checks: Sequence[Check], writes: Sequence[Put | Delete]) -> None:
        """Apply ``writes`` atomically if every check holds (``MULTI_KEY_TRANSACTION`` only).

        Raises:
            ConflictError: a check failed; nothing was written.
            CapabilityError: the adapter does not declare ``MULTI_KEY_TRANSACTION``.
        """
        self.require(self.MULTI_KEY_TRANSACTION)
        for check in checks:
            validate_key(check.key)
            _validate_expected(check.version)
        for write in writes:
            validate_key(write.key)
            if isinstance(write, Put):
                _validate_value(write.value)
        with _Measured("transact"):
            await self._transact(list(checks), list(writes))

    # --- adapter primitives -------------------------------------------------------------------

    @abc.abstractmethod
    async def _get(self, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def _put(
        self, key: str, value: bytes, expected_version: int | None, session: Session | None
    ) -> Record: ...

    @abc.abstractmethod
    async def _delete(self, key: str, expected_version: int | None) -> bool: ...

    @abc.abstractmethod
    async def _delete_range(self, start: str, end: str) -> None: ...

    @abc.abstractmethod
    async def _scan(self, start: str, end: str, limit: int | None) -> list[Record]: ...

    @abc.abstractmethod
    async def _floor(self, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def _ceiling(self, key: str) -> Record | None: ...

    @abc.abstractmethod
    async def _append_sequence(
        self, prefix: str, value: bytes, deltas: tuple[int, ...]
    ) -> Record: ...

    async def _append_sequences(
        self, appends: list[SequenceAppend]
    ) -> list[Record | BaseException]:
        """By default the appends run side by side; an adapter that can commit several at once
        overrides this."""
        return await asyncio.gather(
            *(self._append_sequence(a.prefix, a.value, a.deltas) for a in appends),
            return_exceptions=True,
        )

    @abc.abstractmethod
    async def _watch(self, prefix: str) -> Watch: ...

    @abc.abstractmethod
    async def _open_session(self, ttl: float) -> Session: ...

    async def _transact(self, checks: list[Check], writes: list[Put | Delete]) -> None:
        raise NotImplementedError


class Follower:
    """Hands every event of a watch to ``apply``, in a task of its own, until stopped.

    An event that ``apply`` fails on is logged and skipped: one bad key must not stop a cache
    from following the store.
    """

    def __init__(
        self, watch: Watch, apply: Callable[[WatchEvent], Awaitable[None]], name: str
    ) -> None:
        self._watch = watch
        self._apply = apply
        self._task = asyncio.create_task(self._run(), name=name)

    async def stop(self) -> None:
        """Close the watch and end the task."""
        await self._watch.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        async for event in self._watch:
            try:
                await self._apply(event)
            except Exception:  # noqa: BLE001 - logged; the next event may apply
                _log.warning("%s: cannot apply %s", self._task.get_name(), event, exc_info=True)


class _WatchOpener:
    """Lets ``store.watch(p)`` be awaited or used directly in ``async with``."""

    def __init__(self, opening: Any) -> None:
        self._opening = opening
        self._watch: Watch | None = None

    def __await__(self) -> Any:
        return self._opening.__await__()

    async def __aenter__(self) -> Watch:
        self._watch = await self._opening
        return self._watch

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._watch is not None:
            await self._watch.close()
