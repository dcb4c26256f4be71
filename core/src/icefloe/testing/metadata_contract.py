"""The MetadataStore contract suite: the executable form of ``icefloe.ports.metadata``.

A backend opts in with a small class in its tests::

    class TestEtcdMetadataStore(MetadataStoreContract):
        backend_name = "etcd"

        def backend_options(self, workdir, unique):
            return {"endpoints": ["127.0.0.1:2379"], "namespace": unique}

        async def backdoor_get(self, store, key):  # optional
            ...  # read the key with the server's own client, bypassing the adapter

Every test opens its own instance with a fresh ``unique``, so tests may share one server. The
multi-process tests start children with the ``spawn`` method; each child opens the same
instance through :func:`icefloe.testing.contract.open_backend` with the same options, exactly
as a second broker would. Tests that wait for something (an event, an expiry) poll with a
generous deadline and never assert how fast it happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from icefloe.errors import (
    CapabilityError,
    ClosedError,
    ConflictError,
    SessionExpiredError,
    UnavailableError,
)
from icefloe.ports.base import PortKind
from icefloe.ports.metadata import (
    MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
    MUST_NOT_EXIST,
    TRANSACTION_WRITES,
    Check,
    Delete,
    EventKind,
    MetadataStore,
    Put,
    Record,
    SequenceAppend,
    Watch,
    WatchEvent,
    sequence_components,
    sequence_key,
)
from icefloe.testing.contract import Contract, open_backend

_T = TypeVar("_T")

ALL_START: Final = "\x01"
"""A scan start below every key the suite writes (keys may not be empty or contain NUL)."""
ALL_END: Final = "\U0010ffff"
"""A scan end above every key the suite writes."""

EVENT_TIMEOUT: Final = 20.0
"""Seconds to wait for a watch event that must come."""
CHILD_TIMEOUT: Final = 120.0
"""Seconds a child process may take to start (interpreter, imports) or to finish its work."""

NO_TRANSACTIONS: Final = "adapter does not declare multi_key_transaction"

# Keys whose UTF-8 byte order differs from a per-segment ("hierarchical") order: "-", "." and
# "0" sort around "/", deeper keys sit between shallower ones, and non-ASCII keys of 2, 3 and 4
# UTF-8 bytes sort after every ASCII key.
ORDER_KEYS: Final = (
    "a",
    "a-b",
    "a.b",
    "a/b",
    "a/b-c",
    "a/b/c",
    "a/b/c/d",
    "a/c",
    "a0",
    "ab",
    "b",
    "z/é",
    "é",
    "é/x",
    "中",
    "中/文",
    "😀",
)


# --- helpers shared by tests and child processes ----------------------------------------------


@dataclass(frozen=True)
class BackendRef:
    """Everything a child process needs to open the instance under test (picklable)."""

    kind: PortKind
    name: str
    workdir: str
    options: dict[str, Any]

    async def open(self) -> MetadataStore:
        store = await open_backend(self.kind, self.name, Path(self.workdir), self.options)
        assert isinstance(store, MetadataStore)
        return store


async def next_event(watch: Watch) -> WatchEvent:
    """The watch's next event; fails the test if none comes within :data:`EVENT_TIMEOUT`."""
    event = await asyncio.wait_for(watch.next_event(), EVENT_TIMEOUT)
    assert event is not None, "the watch ended while an event was expected"
    return event


async def events_until(watch: Watch, last_key: str) -> list[WatchEvent]:
    """Events up to and including the first one for ``last_key``."""
    events: list[WatchEvent] = []
    while not events or events[-1].key != last_key:
        events.append(await next_event(watch))
    return events


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``check`` until it returns ``True``; fail naming ``what`` after ``within`` s."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {within:.1f} s")
        await asyncio.sleep(interval)


async def keys_of(store: MetadataStore) -> list[str]:
    return [record.key for record in await store.scan(ALL_START, ALL_END)]


async def append_many(
    store: MetadataStore, prefix: str, tasks: int, per_task: int, tag: str
) -> list[Record]:
    """``tasks`` concurrent tasks each appending ``per_task`` values named after ``tag``."""

    async def one_task(task: int) -> list[Record]:
        return [
            await store.append_sequence(prefix, f"{tag}/{task}/{i}".encode(), [1])
            for i in range(per_task)
        ]

    batches = await asyncio.gather(*(one_task(task) for task in range(tasks)))
    return [record for batch in batches for record in batch]


# Children: module-level functions so that the "spawn" start method can import them.


def _child_run(main: Coroutine[Any, Any, None]) -> None:
    asyncio.run(main)


def child_append(
    ref: BackendRef, prefix: str, tasks: int, per_task: int, ready: Any, go: Any
) -> None:
    """Open the store, report ready, wait for ``go``, then append like the parent does."""

    async def main() -> None:
        store = await ref.open()
        try:
            ready.set()
            await asyncio.to_thread(go.wait, CHILD_TIMEOUT)
            await append_many(store, prefix, tasks, per_task, tag="child")
        finally:
            await store.close()

    _child_run(main())


def child_put_keys(ref: BackendRef, keys: Sequence[str]) -> None:
    """Write ``keys`` one after the other."""

    async def main() -> None:
        store = await ref.open()
        try:
            for key in keys:
                await store.put(key, b"from a child")
        finally:
            await store.close()

    _child_run(main())


def child_hold_ephemeral(ref: BackendRef, key: str, ttl: float, results: Any) -> None:
    """Write ``key`` in a session, then wait for the session to be lost (or to be killed).

    Puts ``("lost", error)`` on ``results`` once the session is lost, where ``error`` names
    what a later put with that session raised.
    """

    async def main() -> None:
        store = await ref.open()
        try:
            session = await store.open_session(ttl)
            await store.put(key, b"held", session=session)
            results.put(("holding", None))
            await asyncio.wait_for(asyncio.shield(session.lost), CHILD_TIMEOUT)
            try:
                await store.put(key + "/after", b"too late", session=session)
                error = None
            except Exception as exc:  # noqa: BLE001 - reported to the parent by its type name
                error = type(exc).__name__
            results.put(("lost", error))
        finally:
            await store.close()

    _child_run(main())


@contextlib.asynccontextmanager
async def child_process(target: Callable[..., None], *args: Any) -> AsyncIterator[SpawnProcess]:
    """Run ``target(*args)`` in a spawned process; kill it if it outlives the block."""
    process = multiprocessing.get_context("spawn").Process(target=target, args=args, daemon=True)
    process.start()
    try:
        yield process
    finally:
        if process.is_alive():
            process.kill()
        await asyncio.to_thread(process.join, CHILD_TIMEOUT)


async def wait_for_child(process: SpawnProcess, condition: Callable[[float], _T]) -> _T:
    """Wait (off the event loop) until ``condition(timeout)`` is truthy; fail if the child dies.

    ``condition`` is a blocking wait with a timeout, such as ``event.wait`` or ``queue.get``.
    """
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # queue.Empty from a timed-out get
            result = await asyncio.to_thread(condition, 0.1)
            if result:
                return result
        if process.exitcode is not None:
            pytest.fail(f"the child process exited with code {process.exitcode}")
    pytest.fail(f"the child process did not report within {CHILD_TIMEOUT} s")


def assert_runs_in_commit_order(events: Sequence[WatchEvent], keys: Sequence[str]) -> None:
    """``events`` are PUTs of ``keys`` in write order, or runs of them separated by RESETs.

    Without a RESET every key must appear exactly once, in order. A RESET may stand for any
    number of missed keys, but nothing may go missing without one: the first run starts at the
    first key, and each run is consecutive keys after the previous run.
    """
    runs: list[list[str]] = [[]]
    versions: list[int] = []
    for event in events:
        if event.kind is EventKind.RESET:
            runs.append([])
        else:
            assert event.kind is EventKind.PUT, event
            assert event.key is not None
            assert event.version is not None
            runs[-1].append(event.key)
            versions.append(event.version)
    assert versions == sorted(set(versions)), f"versions out of commit order: {events}"
    position = 0
    for index, run in enumerate(runs):
        if not run:
            continue
        start = keys.index(run[0])
        if index == 0:
            assert start == 0, f"events were missed before the first one: {events}"
        assert start >= position, f"events went back in time: {events}"
        assert run == list(keys[start : start + len(run)]), f"events were missed: {events}"
        position = start + len(run)
    assert position == len(keys), f"the last events were missed: {events}"


# --- the state machine -------------------------------------------------------------------------

MODEL_ALPHABET: Final = "ab/-é😀"
"""Few characters, so keys collide; ASCII below and above "/" plus 2- and 4-byte UTF-8."""
MODEL_SEQUENCES: Final = {"q": 1, "a/q": 2}
"""Sequence prefixes and their component counts; "q" never occurs in other model keys."""

model_keys = st.text(alphabet=MODEL_ALPHABET, min_size=1, max_size=4)
model_values = st.binary(max_size=8)


class MetadataStoreMachine(RuleBasedStateMachine):
    """Drives a fresh store and a sorted-dict model with the same operations; they must agree.

    The rules are synchronous (Hypothesis drives them); each runs the store's coroutine on the
    machine's own event loop, which lives as long as the store. A test binds :attr:`contract`
    and :attr:`workdir` in a subclass (Hypothesis builds machines from a class).
    """

    contract: ClassVar[MetadataStoreContract]
    workdir: ClassVar[Path]

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        try:
            # A fresh instance per example: nothing leaks from one example to the next.
            workdir = self.workdir / uuid.uuid4().hex[:8]
            options = self.contract.backend_options(workdir, self.contract.new_unique())
            self.store = self.run(self.contract.open_store(workdir, options))
        except BaseException:
            self.runner.close()
            raise
        self.model: dict[str, Record] = {}
        self.highest: dict[str, int] = {}
        """The highest version each key has ever had: new versions must exceed it."""

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.runner.run(coro)

    def teardown(self) -> None:
        try:
            self.run(self.store.close())
        finally:
            self.runner.close()

    def written(self, record: Record, key: str, value: bytes) -> None:
        assert (record.key, record.value) == (key, value)
        assert record.version > self.highest.get(key, 0)
        self.highest[key] = record.version
        self.model[key] = record

    def wrong_version(self, key: str) -> int:
        current = self.model.get(key)
        return current.version + 1 if current else 1

    def sorted_model(self) -> list[Record]:
        return [self.model[key] for key in sorted(self.model)]

    @rule(key=model_keys, value=model_values)
    def put(self, key: str, value: bytes) -> None:
        self.written(self.run(self.store.put(key, value)), key, value)

    @rule(key=model_keys, value=model_values, right=st.booleans())
    def put_with_expected_version(self, key: str, value: bytes, right: bool) -> None:
        current = self.model.get(key)
        if right and current is not None:
            record = self.run(self.store.put(key, value, expected_version=current.version))
            self.written(record, key, value)
        else:
            with pytest.raises(ConflictError):
                self.run(self.store.put(key, value, expected_version=self.wrong_version(key)))

    @rule(key=model_keys, value=model_values)
    def put_if_absent(self, key: str, value: bytes) -> None:
        if key in self.model:
            with pytest.raises(ConflictError):
                self.run(self.store.put(key, value, expected_version=MUST_NOT_EXIST))
        else:
            record = self.run(self.store.put(key, value, expected_version=MUST_NOT_EXIST))
            self.written(record, key, value)

    @rule(key=model_keys)
    def delete(self, key: str) -> None:
        assert self.run(self.store.delete(key)) == (key in self.model)
        self.model.pop(key, None)

    @rule(key=model_keys, right=st.booleans())
    def delete_with_expected_version(self, key: str, right: bool) -> None:
        current = self.model.get(key)
        if right and current is not None:
            assert self.run(self.store.delete(key, expected_version=current.version))
            del self.model[key]
        else:
            with pytest.raises(ConflictError):
                self.run(self.store.delete(key, expected_version=self.wrong_version(key)))

    @rule(start=model_keys, end=model_keys)
    def delete_range(self, start: str, end: str) -> None:
        self.run(self.store.delete_range(start, end))
        for key in [key for key in self.model if start <= key < end]:
            del self.model[key]

    @rule(key=model_keys)
    def get(self, key: str) -> None:
        assert self.run(self.store.get(key)) == self.model.get(key)

    @rule(start=model_keys, end=model_keys, limit=st.none() | st.integers(1, 4))
    def scan(self, start: str, end: str, limit: int | None) -> None:
        expected = [record for record in self.sorted_model() if start <= record.key < end]
        assert self.run(self.store.scan(start, end, limit=limit)) == expected[:limit]

    @rule(key=model_keys)
    def floor(self, key: str) -> None:
        below = [record for record in self.sorted_model() if record.key <= key]
        assert self.run(self.store.floor(key)) == (below[-1] if below else None)

    @rule(key=model_keys)
    def ceiling(self, key: str) -> None:
        above = [record for record in self.sorted_model() if record.key >= key]
        assert self.run(self.store.ceiling(key)) == (above[0] if above else None)

    @rule(
        prefix=st.sampled_from(sorted(MODEL_SEQUENCES)),
        first=st.integers(1, 3),
        rest=st.integers(0, 3),
        value=model_values,
    )
    def append_sequence(self, prefix: str, first: int, rest: int, value: bytes) -> None:
        deltas = [first] + [rest] * (MODEL_SEQUENCES[prefix] - 1)
        entries = [key for key in self.model if key.startswith(prefix + "-")]
        last = sequence_components(prefix, max(entries)) if entries else (0,) * len(deltas)
        key = sequence_key(prefix, [c + d for c, d in zip(last, deltas, strict=True)])
        self.written(self.run(self.store.append_sequence(prefix, value, deltas)), key, value)


# --- the suite -----------------------------------------------------------------------------------

# Calls the port must reject with ValueError, before touching any data.
INVALID_CALLS: Final[dict[str, Callable[[MetadataStore], Awaitable[object]]]] = {
    "get-empty-key": lambda store: store.get(""),
    "get-key-with-nul": lambda store: store.get("a\x00b"),
    "get-key-too-long": lambda store: store.get("k" * (MAX_KEY_BYTES + 1)),
    "put-empty-key": lambda store: store.put("", b"v"),
    "put-key-with-nul": lambda store: store.put("a\x00b", b"v"),
    "put-value-too-large": lambda store: store.put("k", b"x" * (MAX_VALUE_BYTES + 1)),
    "put-expected-version-zero": lambda store: store.put("k", b"v", expected_version=0),
    "put-expected-version-negative": lambda store: store.put("k", b"v", expected_version=-2),
    "delete-must-not-exist": lambda store: store.delete("k", expected_version=MUST_NOT_EXIST),
    "scan-limit-zero": lambda store: store.scan("a", "b", limit=0),
    "append-no-deltas": lambda store: store.append_sequence("seq", b"v", []),
    "append-first-delta-zero": lambda store: store.append_sequence("seq", b"v", [0, 1]),
    "append-negative-delta": lambda store: store.append_sequence("seq", b"v", [1, -1]),
    "append-prefix-with-nul": lambda store: store.append_sequence("s\x00q", b"v", [1]),
}


class MetadataStoreContract(Contract):
    """Generic tests every :class:`MetadataStore` adapter passes; see the module docstring."""

    port_kind: ClassVar[PortKind] = PortKind.METADATA

    session_ttl: ClassVar[float] = 1.0
    """Session ttl used by the expiry tests; raise it if the server has a larger minimum."""
    expiry_slack: ClassVar[float] = 15.0
    """Seconds allowed beyond ``session_ttl`` for an expired session's keys to vanish."""
    machine_settings: ClassVar[settings] = settings(
        max_examples=30,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )

    # --- what an implementer may override ---------------------------------------------------

    async def backdoor_get(self, store: MetadataStore, key: str) -> bytes | None:
        """The value really stored at ``key``, read behind the adapter's back; ``None`` if absent.

        Optional: when provided, writes and deletes are also checked against the real state.
        """
        raise NotImplementedError

    async def open_store(self, workdir: Path, options: dict[str, Any]) -> MetadataStore:
        store = await self.open_backend(workdir, options)
        assert isinstance(store, MetadataStore)
        return store

    # --- fixtures and helpers ---------------------------------------------------------------

    @pytest.fixture
    def options(self, tmp_path: Path) -> dict[str, Any]:
        return self.backend_options(tmp_path, self.new_unique())

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path, options: dict[str, Any]) -> AsyncIterator[MetadataStore]:
        store = await self.open_store(tmp_path, options)
        try:
            yield store
        finally:
            # Some tests close the store themselves; a second close may say so.
            with contextlib.suppress(ClosedError):
                await store.close()

    @pytest.fixture
    def ref(self, tmp_path: Path, options: dict[str, Any]) -> BackendRef:
        """How a child process opens the same instance as ``store``."""
        return BackendRef(self.port_kind, self.backend_name, str(tmp_path), options)

    @pytest.fixture
    def transactional(self, store: MetadataStore) -> MetadataStore:
        """``store``, when it declares multi-key transactions; otherwise the test is skipped."""
        if not store.supports(MetadataStore.MULTI_KEY_TRANSACTION):
            pytest.skip(NO_TRANSACTIONS)
        return store

    async def assert_stored(self, store: MetadataStore, key: str, expected: bytes | None) -> None:
        """Check the real state behind the adapter, when the back door is provided."""
        try:
            actual = await self.backdoor_get(store, key)
        except NotImplementedError:
            return
        assert actual == expected

    async def outlive_ttl(self, store: MetadataStore, key: str) -> None:
        """Wait past the session ttl and check that ``key`` is still held.

        Expiry is then measured from a keep-alive, not from the session's creation.
        """
        await asyncio.sleep(self.session_ttl * 1.5)
        assert await store.get(key) is not None, "the holder's keep-alive did not hold the key"

    async def wait_until_expired(self, store: MetadataStore, key: str) -> None:
        """Wait until the ephemeral ``key`` is gone, at most the ttl plus the expiry slack."""

        async def gone() -> bool:
            return await store.get(key) is None

        await eventually(gone, self.session_ttl + self.expiry_slack, f"the expiry of {key!r}")

    async def stall(self, store: MetadataStore, pid: int) -> None:
        """Stop process ``pid`` (SIGSTOP) at a moment when it holds no lock that ``store`` needs.

        An embedded backend's processes share one database lock: a process stopped inside a
        write blocks every writer until it resumes, which is not what the caller tests. A write
        succeeding while the process is stopped shows it holds no such lock.
        """
        for _ in range(10):
            os.kill(pid, signal.SIGSTOP)
            try:
                await store.put("probe/stalled", b"")
                return
            except UnavailableError:
                os.kill(pid, signal.SIGCONT)
                await asyncio.sleep(0.01)
        pytest.fail("could not stop the child while it held no lock")

    # --- get and put ------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_get_of_a_missing_key_is_none(self, store: MetadataStore) -> None:
        assert await store.get("missing/key") is None

    @pytest.mark.asyncio
    async def test_put_then_get_returns_the_value_and_version(self, store: MetadataStore) -> None:
        record = await store.put("dir/key", b"hello, metadata")
        assert (record.key, record.value) == ("dir/key", b"hello, metadata")
        assert record.version > 0
        assert await store.get("dir/key") == record
        await self.assert_stored(store, "dir/key", b"hello, metadata")

    @pytest.mark.asyncio
    async def test_empty_value_round_trips(self, store: MetadataStore) -> None:
        await store.put("empty", b"")
        record = await store.get("empty")
        assert record is not None
        assert record.value == b""

    @pytest.mark.asyncio
    async def test_put_overwrites_the_value(self, store: MetadataStore) -> None:
        await store.put("key", b"old value, longer")
        await store.put("key", b"new")
        record = await store.get("key")
        assert record is not None
        assert record.value == b"new"
        await self.assert_stored(store, "key", b"new")

    @pytest.mark.asyncio
    async def test_every_write_gives_the_key_a_greater_version(self, store: MetadataStore) -> None:
        versions = [(await store.put("key", bytes([i]))).version for i in range(3)]
        await store.delete("key")
        versions.append((await store.put("key", b"again")).version)
        assert versions == sorted(set(versions)), versions

    @pytest.mark.asyncio
    @pytest.mark.parametrize("call", sorted(INVALID_CALLS))
    async def test_invalid_argument_raises_value_error_and_writes_nothing(
        self, store: MetadataStore, call: str
    ) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the port's messages vary per argument
            await INVALID_CALLS[call](store)
        assert await keys_of(store) == []

    @pytest.mark.asyncio
    async def test_watch_prefix_with_nul_raises_value_error(self, store: MetadataStore) -> None:
        with pytest.raises(ValueError, match="NUL"):
            store.watch("a\x00")

    # --- compare-and-set --------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_put_with_the_current_version_succeeds(self, store: MetadataStore) -> None:
        first = await store.put("key", b"one")
        second = await store.put("key", b"two", expected_version=first.version)
        assert second.version > first.version
        assert await store.get("key") == second

    @pytest.mark.asyncio
    async def test_put_with_a_stale_version_raises_conflict_and_keeps_the_value(
        self, store: MetadataStore
    ) -> None:
        stale = await store.put("key", b"one")
        current = await store.put("key", b"two")
        with pytest.raises(ConflictError):
            await store.put("key", b"three", expected_version=stale.version)
        assert await store.get("key") == current
        await self.assert_stored(store, "key", b"two")

    @pytest.mark.asyncio
    async def test_put_with_a_version_on_a_missing_key_raises_conflict(
        self, store: MetadataStore
    ) -> None:
        version = (await store.put("other", b"x")).version
        with pytest.raises(ConflictError):
            await store.put("key", b"v", expected_version=version)
        assert await store.get("key") is None

    @pytest.mark.asyncio
    async def test_put_must_not_exist_creates_a_missing_key(self, store: MetadataStore) -> None:
        record = await store.put("key", b"new", expected_version=MUST_NOT_EXIST)
        assert await store.get("key") == record

    @pytest.mark.asyncio
    async def test_put_must_not_exist_on_an_existing_key_raises_conflict(
        self, store: MetadataStore
    ) -> None:
        existing = await store.put("key", b"old")
        with pytest.raises(ConflictError):
            await store.put("key", b"new", expected_version=MUST_NOT_EXIST)
        assert await store.get("key") == existing
        await self.assert_stored(store, "key", b"old")

    @pytest.mark.asyncio
    async def test_concurrent_compare_and_set_has_exactly_one_winner(
        self, store: MetadataStore
    ) -> None:
        base = await store.put("key", b"base")
        results = await asyncio.gather(
            *(store.put("key", bytes([i]), expected_version=base.version) for i in range(8)),
            return_exceptions=True,
        )
        winners = [result for result in results if isinstance(result, Record)]
        losers = [result for result in results if not isinstance(result, Record)]
        assert len(winners) == 1, results
        assert all(isinstance(loser, ConflictError) for loser in losers), losers
        assert await store.get("key") == winners[0]

    # --- delete -----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_delete_of_a_present_key_returns_true_and_removes_it(
        self, store: MetadataStore
    ) -> None:
        await store.put("key", b"v")
        assert await store.delete("key") is True
        assert await store.get("key") is None
        await self.assert_stored(store, "key", None)

    @pytest.mark.asyncio
    async def test_delete_of_a_missing_key_returns_false(self, store: MetadataStore) -> None:
        assert await store.delete("missing") is False

    @pytest.mark.asyncio
    async def test_delete_with_the_current_version_removes_the_key(
        self, store: MetadataStore
    ) -> None:
        record = await store.put("key", b"v")
        assert await store.delete("key", expected_version=record.version) is True
        assert await store.get("key") is None

    @pytest.mark.asyncio
    async def test_delete_with_a_stale_version_raises_conflict_and_keeps_the_key(
        self, store: MetadataStore
    ) -> None:
        stale = await store.put("key", b"one")
        current = await store.put("key", b"two")
        with pytest.raises(ConflictError):
            await store.delete("key", expected_version=stale.version)
        assert await store.get("key") == current
        await self.assert_stored(store, "key", b"two")

    @pytest.mark.asyncio
    async def test_delete_with_a_version_of_a_missing_key_raises_conflict(
        self, store: MetadataStore
    ) -> None:
        version = (await store.put("other", b"x")).version
        with pytest.raises(ConflictError):
            await store.delete("key", expected_version=version)

    @pytest.mark.asyncio
    async def test_delete_range_deletes_exactly_start_to_end(self, store: MetadataStore) -> None:
        for key in ["a", "a/x", "a/x/y", "b", "b/x", "c"]:
            await store.put(key, key.encode())
        await store.delete_range("a/", "b/")
        assert await keys_of(store) == ["a", "b/x", "c"]
        await self.assert_stored(store, "a/x/y", None)
        await self.assert_stored(store, "b/x", b"b/x")

    # --- ordered reads ----------------------------------------------------------------------

    async def fill(self, store: MetadataStore, keys: Sequence[str]) -> None:
        # Written in reverse so that insertion order cannot pass for key order.
        for key in reversed(keys):
            await store.put(key, key.encode())

    @pytest.mark.asyncio
    async def test_scan_is_in_utf8_byte_order(self, store: MetadataStore) -> None:
        await self.fill(store, ORDER_KEYS)
        expected = sorted(ORDER_KEYS, key=lambda key: key.encode())
        assert await keys_of(store) == expected

    @pytest.mark.asyncio
    async def test_scan_returns_values_and_versions(self, store: MetadataStore) -> None:
        written = [await store.put(key, key.encode()) for key in ["s/1", "s/2"]]
        assert await store.scan("s/", "s0") == written

    @pytest.mark.asyncio
    async def test_scan_includes_start_and_excludes_end(self, store: MetadataStore) -> None:
        await self.fill(store, ORDER_KEYS)
        records = await store.scan("a/b", "a0")
        assert [record.key for record in records] == ["a/b", "a/b-c", "a/b/c", "a/b/c/d", "a/c"]

    @pytest.mark.asyncio
    async def test_scan_of_a_folder_includes_deeper_keys(self, store: MetadataStore) -> None:
        await self.fill(store, ORDER_KEYS)
        records = await store.scan("a/", "a0")
        assert [record.key for record in records] == ["a/b", "a/b-c", "a/b/c", "a/b/c/d", "a/c"]

    @pytest.mark.asyncio
    async def test_scan_honours_the_limit(self, store: MetadataStore) -> None:
        await self.fill(store, ORDER_KEYS)
        records = await store.scan("a", "b", limit=3)
        assert [record.key for record in records] == ["a", "a-b", "a.b"]

    @pytest.mark.asyncio
    async def test_scan_with_start_not_below_end_is_empty(self, store: MetadataStore) -> None:
        await self.fill(store, ORDER_KEYS)
        assert await store.scan("b", "b") == []
        assert await store.scan("b", "a") == []

    @pytest.mark.asyncio
    async def test_scan_of_non_ascii_keys(self, store: MetadataStore) -> None:
        await self.fill(store, ORDER_KEYS)
        records = await store.scan("é", "\U0010ffff")
        assert [record.key for record in records] == ["é", "é/x", "中", "中/文", "😀"]

    @pytest.mark.asyncio
    async def test_floor_and_ceiling_of_an_existing_key_are_that_key(
        self, store: MetadataStore
    ) -> None:
        await self.fill(store, ["b", "d", "f"])
        floor, ceiling = await store.floor("d"), await store.ceiling("d")
        assert floor is not None
        assert ceiling is not None
        assert (floor.key, ceiling.key) == ("d", "d")
        assert floor.value == b"d"

    @pytest.mark.asyncio
    async def test_floor_and_ceiling_between_keys_are_the_neighbours(
        self, store: MetadataStore
    ) -> None:
        await self.fill(store, ["b", "d", "f"])
        floor, ceiling = await store.floor("c"), await store.ceiling("c")
        assert floor is not None
        assert ceiling is not None
        assert (floor.key, ceiling.key) == ("b", "d")

    @pytest.mark.asyncio
    async def test_floor_before_the_first_key_is_none(self, store: MetadataStore) -> None:
        await self.fill(store, ["b", "d", "f"])
        assert await store.floor("a") is None
        ceiling = await store.ceiling("a")
        assert ceiling is not None
        assert ceiling.key == "b"

    @pytest.mark.asyncio
    async def test_ceiling_after_the_last_key_is_none(self, store: MetadataStore) -> None:
        await self.fill(store, ["b", "d", "f"])
        assert await store.ceiling("g") is None
        floor = await store.floor("g")
        assert floor is not None
        assert floor.key == "f"

    @pytest.mark.asyncio
    async def test_floor_and_ceiling_follow_byte_order_across_folders(
        self, store: MetadataStore
    ) -> None:
        await self.fill(store, ["b", "b/x", "b/x/y", "b0", "c"])
        floor, ceiling = await store.floor("b/z"), await store.ceiling("b/")
        assert floor is not None
        assert ceiling is not None
        # By segments, floor("b/z") would be "b/x" and ceiling("b/") could skip to "b0".
        assert (floor.key, ceiling.key) == ("b/x/y", "b/x")

    @pytest.mark.asyncio
    async def test_floor_and_ceiling_of_an_empty_store_are_none(self, store: MetadataStore) -> None:
        assert await store.floor("k") is None
        assert await store.ceiling("k") is None

    # --- sequenced append -------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_append_sequence_starts_at_the_first_delta(self, store: MetadataStore) -> None:
        record = await store.append_sequence("streams/7/index", b"first", [1])
        assert record.key == "streams/7/index-00000000000000000001"
        assert record.value == b"first"
        assert await store.get(record.key) == record
        await self.assert_stored(store, record.key, b"first")

    @pytest.mark.asyncio
    async def test_append_sequence_adds_each_delta_to_its_component(
        self, store: MetadataStore
    ) -> None:
        first = await store.append_sequence("streams/7/index", b"a", [3, 100])
        second = await store.append_sequence("streams/7/index", b"b", [2, 0])
        third = await store.append_sequence("streams/7/index", b"c", [1, 50])
        assert first.key == "streams/7/index-00000000000000000003-00000000000000000100"
        assert sequence_components("streams/7/index", second.key) == (5, 100)
        assert sequence_components("streams/7/index", third.key) == (6, 150)
        assert first.version < second.version < third.version

    @pytest.mark.asyncio
    async def test_sequences_with_different_prefixes_are_independent(
        self, store: MetadataStore
    ) -> None:
        await store.append_sequence("seq/a", b"", [5])
        await store.append_sequence("seq/ab", b"", [1])
        await store.put("seq/a0", b"not a sequence key")
        record = await store.append_sequence("seq/a", b"", [1])
        assert sequence_components("seq/a", record.key) == (6,)

    @pytest.mark.asyncio
    async def test_append_sequence_continues_after_the_highest_remaining_key(
        self, store: MetadataStore
    ) -> None:
        records = [await store.append_sequence("seq", b"", [1]) for _ in range(3)]
        await store.delete(records[-1].key)
        record = await store.append_sequence("seq", b"", [1])
        assert sequence_components("seq", record.key) == (3,)

    @pytest.mark.asyncio
    async def test_appends_made_together_land_as_if_made_one_after_the_other(
        self, store: MetadataStore
    ) -> None:
        await store.append_sequence("streams/1/index", b"before", [2, 10])
        appends = [
            SequenceAppend("streams/1/index", b"a", (3, 30)),
            SequenceAppend("streams/2/index", b"b", (1, 5)),
            SequenceAppend("streams/1/index", b"c", (1, 0)),
        ]
        outcomes = await store.append_sequences(appends)
        records = [o for o in outcomes if isinstance(o, Record)]
        assert len(records) == 3, outcomes
        assert [
            (sequence_components(a.prefix, r.key), r.value)
            for a, r in zip(appends, records, strict=True)
        ] == [((5, 40), b"a"), ((1, 5), b"b"), ((6, 40), b"c")]
        for record in records:
            assert await store.get(record.key) == record
        assert await store.append_sequences([]) == []

    @pytest.mark.asyncio
    async def test_appends_made_together_concurrently_stay_gapless_and_unique(
        self, store: MetadataStore
    ) -> None:
        async def batch(tag: int) -> list[Record | BaseException]:
            return await store.append_sequences(
                [SequenceAppend("seq", f"{tag}/{i}".encode(), (1,)) for i in range(5)]
            )

        outcomes = [o for b in await asyncio.gather(*(batch(t) for t in range(4))) for o in b]
        records = [o for o in outcomes if isinstance(o, Record)]
        assert len(records) == 20, outcomes
        components = sorted(sequence_components("seq", r.key) for r in records)
        assert components == [(n,) for n in range(1, 21)]

    @pytest.mark.asyncio
    async def test_a_malformed_append_among_several_appends_none(
        self, store: MetadataStore
    ) -> None:
        with pytest.raises(ValueError, match="deltas"):
            await store.append_sequences(
                [SequenceAppend("seq", b"ok", (1,)), SequenceAppend("seq", b"bad", (0,))]
            )
        assert await keys_of(store) == []

    @pytest.mark.asyncio
    async def test_concurrent_appends_from_two_processes_are_gapless_and_unique(
        self, store: MetadataStore, ref: BackendRef
    ) -> None:
        tasks, per_task, prefix = 4, 10, "streams/1/index"
        context = multiprocessing.get_context("spawn")
        ready, go = context.Event(), context.Event()
        async with child_process(child_append, ref, prefix, tasks, per_task, ready, go) as child:
            await wait_for_child(child, ready.wait)
            go.set()
            await append_many(store, prefix, tasks, per_task, tag="parent")
            await asyncio.to_thread(child.join, CHILD_TIMEOUT)
            assert child.exitcode == 0
        records = await store.scan(prefix + "-", prefix + "-~")
        total = 2 * tasks * per_task
        assert [sequence_components(prefix, r.key) for r in records] == [
            (n,) for n in range(1, total + 1)
        ]
        values = {record.value for record in records}
        assert len(values) == total
        assert {value.split(b"/")[0] for value in values} == {b"parent", b"child"}

    # --- notifications ----------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_watch_sees_puts_and_deletes_in_commit_order(self, store: MetadataStore) -> None:
        async with store.watch("w/") as watch:
            a = await store.put("w/a", b"1")
            b = await store.put("w/b", b"2")
            await store.delete("w/a")
            c = await store.put("w/c", b"3")
            events = [await next_event(watch) for _ in range(4)]
        assert [(e.kind, e.key) for e in events] == [
            (EventKind.PUT, "w/a"),
            (EventKind.PUT, "w/b"),
            (EventKind.DELETE, "w/a"),
            (EventKind.PUT, "w/c"),
        ]
        assert [events[0].version, events[1].version, events[3].version] == [
            a.version,
            b.version,
            c.version,
        ]

    @pytest.mark.asyncio
    async def test_watch_sees_only_changes_after_it_was_established(
        self, store: MetadataStore
    ) -> None:
        await store.put("w/before", b"")
        async with store.watch("w/") as watch:
            await store.put("w/after", b"")
            event = await next_event(watch)
        assert (event.kind, event.key) == (EventKind.PUT, "w/after")

    @pytest.mark.asyncio
    async def test_watch_sees_only_keys_starting_with_its_prefix(
        self, store: MetadataStore
    ) -> None:
        async with store.watch("w/a") as watch:
            for key in ["w/a", "w/b", "w/a/1", "w", "x/w/a", "w/ab", "w/a-end"]:
                await store.put(key, b"")
            events = await events_until(watch, "w/a-end")
        assert [event.key for event in events] == ["w/a", "w/a/1", "w/ab", "w/a-end"]

    @pytest.mark.asyncio
    async def test_watch_with_an_empty_prefix_sees_every_key(self, store: MetadataStore) -> None:
        async with store.watch() as watch:
            for key in ["a", "é/1", "z"]:
                await store.put(key, b"")
            events = await events_until(watch, "z")
        assert [event.key for event in events] == ["a", "é/1", "z"]

    @pytest.mark.asyncio
    async def test_watch_sees_delete_range_as_deletes(self, store: MetadataStore) -> None:
        for key in ["r/1", "r/2", "r/3"]:
            await store.put(key, b"")
        async with store.watch("r/") as watch:
            await store.delete_range("r/1", "r/3")
            events = [await next_event(watch) for _ in range(2)]
        assert sorted((e.kind, e.key) for e in events) == [
            (EventKind.DELETE, "r/1"),
            (EventKind.DELETE, "r/2"),
        ]

    @pytest.mark.asyncio
    async def test_watch_sees_changes_made_by_another_process(
        self, store: MetadataStore, ref: BackendRef
    ) -> None:
        keys = [f"w/child/{i:02d}" for i in range(20)]
        async with (
            store.watch("w/") as watch,
            child_process(child_put_keys, ref, keys) as child,
        ):
            events = await events_until(watch, keys[-1])
            await asyncio.to_thread(child.join, CHILD_TIMEOUT)
            assert child.exitcode == 0
        assert_runs_in_commit_order(events, keys)

    @pytest.mark.asyncio
    async def test_watches_do_not_steal_each_others_events(self, store: MetadataStore) -> None:
        async with store.watch("w/") as first, store.watch("w/") as second:
            await store.put("w/key", b"")
            one, two = await next_event(first), await next_event(second)
        assert one.key == two.key == "w/key"

    @pytest.mark.asyncio
    async def test_closed_watch_returns_none(self, store: MetadataStore) -> None:
        watch = await store.watch("w/")
        await watch.close()
        await store.put("w/key", b"")
        assert await asyncio.wait_for(watch.next_event(), EVENT_TIMEOUT) is None
        await watch.close()  # idempotent

    @pytest.mark.asyncio
    async def test_watch_returns_none_after_the_store_closes(self, store: MetadataStore) -> None:
        watch = await store.watch("w/")
        await store.close()
        assert await asyncio.wait_for(watch.next_event(), EVENT_TIMEOUT) is None

    @pytest.mark.asyncio
    async def test_async_iteration_ends_when_the_watch_closes(self, store: MetadataStore) -> None:
        watch = await store.watch("w/")
        await store.put("w/key", b"")
        seen: list[WatchEvent] = []
        async with asyncio.timeout(EVENT_TIMEOUT):
            async for event in watch:
                seen.append(event)
                await watch.close()
        assert [event.key for event in seen] == ["w/key"]

    # --- sessions ---------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_ephemeral_key_lives_while_its_session_lives(self, store: MetadataStore) -> None:
        async with await store.open_session(self.session_ttl) as session:
            record = await store.put("live/key", b"v", session=session)
            # Longer than the ttl: the background keep-alive must hold the key.
            await asyncio.sleep(self.session_ttl * 2)
            assert session.alive
            assert await store.get("live/key") == record

    @pytest.mark.asyncio
    async def test_closing_a_session_deletes_its_ephemeral_keys(self, store: MetadataStore) -> None:
        session = await store.open_session(self.session_ttl)
        await store.put("live/1", b"", session=session)
        await store.put("live/2", b"", session=session)
        await store.put("kept", b"")
        await session.close()
        assert await keys_of(store) == ["kept"]
        await self.assert_stored(store, "live/1", None)
        assert session.lost.done()
        await session.close()  # idempotent

    @pytest.mark.asyncio
    async def test_watch_sees_the_deletes_of_a_closed_session(self, store: MetadataStore) -> None:
        session = await store.open_session(self.session_ttl)
        await store.put("live/1", b"", session=session)
        async with store.watch("live/") as watch:
            await session.close()
            event = await next_event(watch)
        assert (event.kind, event.key) == (EventKind.DELETE, "live/1")

    @pytest.mark.asyncio
    async def test_put_with_a_lost_session_raises_session_expired(
        self, store: MetadataStore
    ) -> None:
        session = await store.open_session(self.session_ttl)
        await session.close()
        with pytest.raises(SessionExpiredError):
            await store.put("live/key", b"", session=session)
        assert await store.get("live/key") is None

    @pytest.mark.asyncio
    async def test_ephemeral_key_vanishes_after_its_holder_is_killed(
        self, store: MetadataStore, ref: BackendRef
    ) -> None:
        results = multiprocessing.get_context("spawn").Queue()
        args = (ref, "live/held", self.session_ttl, results)
        async with child_process(child_hold_ephemeral, *args) as child:
            assert await wait_for_child(child, lambda t: results.get(timeout=t))
            await self.outlive_ttl(store, "live/held")
            child.kill()
            await asyncio.to_thread(child.join, CHILD_TIMEOUT)
            await self.wait_until_expired(store, "live/held")

    @pytest.mark.asyncio
    async def test_session_of_a_stalled_holder_is_lost(
        self, store: MetadataStore, ref: BackendRef
    ) -> None:
        if not hasattr(signal, "SIGSTOP"):
            pytest.skip("needs SIGSTOP to stall a process")
        results = multiprocessing.get_context("spawn").Queue()
        args = (ref, "live/held", self.session_ttl, results)
        async with child_process(child_hold_ephemeral, *args) as child:
            assert await wait_for_child(child, lambda t: results.get(timeout=t))
            await self.outlive_ttl(store, "live/held")
            assert child.pid is not None
            await self.stall(store, child.pid)
            try:
                await self.wait_until_expired(store, "live/held")
            finally:
                os.kill(child.pid, signal.SIGCONT)
            report = await wait_for_child(child, lambda t: results.get(timeout=t))
        assert report == ("lost", SessionExpiredError.__name__)
        assert await store.get("live/held/after") is None

    # --- transactions -----------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_transact_applies_every_write_when_all_checks_hold(
        self, transactional: MetadataStore
    ) -> None:
        store = transactional
        a = await store.put("t/a", b"a0")
        await store.put("t/c", b"c0")
        await store.transact(
            [Check("t/a", a.version), Check("t/b", MUST_NOT_EXIST)],
            [Put("t/a", b"a1"), Put("t/b", b"b1"), Delete("t/c")],
        )
        after = {record.key: record for record in await store.scan("t/", "t0")}
        assert {key: record.value for key, record in after.items()} == {
            "t/a": b"a1",
            "t/b": b"b1",
        }
        assert after["t/a"].version > a.version
        await self.assert_stored(store, "t/c", None)

    @pytest.mark.asyncio
    async def test_transact_takes_as_many_writes_as_the_port_promises(
        self, transactional: MetadataStore
    ) -> None:
        store = transactional
        names = [f"t/{n:03d}" for n in range(TRANSACTION_WRITES)]
        for name in names:
            await store.put(name, b"old")
        await store.transact([], [Delete(name) for name in names])
        assert await keys_of(store) == []
        # Deleting a key that is gone is no error (a swap finished by another compactor).
        await store.transact([], [Put(name, b"new") for name in names[1:]] + [Delete(names[0])])
        await store.put(names[0], b"new")
        assert [record.value for record in await store.scan("t/", "t0")] == [b"new"] * len(names)

    @pytest.mark.asyncio
    async def test_transact_with_a_failing_check_writes_nothing(
        self, transactional: MetadataStore
    ) -> None:
        store = transactional
        a = await store.put("t/a", b"a0")
        stale = await store.put("t/c", b"c0")
        await store.put("t/c", b"c1")
        before = await store.scan("t/", "t0")
        with pytest.raises(ConflictError):
            await store.transact(
                [Check("t/a", a.version), Check("t/c", stale.version)],
                [Put("t/a", b"a1"), Put("t/b", b"b1"), Delete("t/c")],
            )
        assert await store.scan("t/", "t0") == before
        await self.assert_stored(store, "t/b", None)

    @pytest.mark.asyncio
    async def test_transact_must_not_exist_check_fails_on_an_existing_key(
        self, transactional: MetadataStore
    ) -> None:
        await transactional.put("t/a", b"a0")
        with pytest.raises(ConflictError):
            await transactional.transact([Check("t/a", MUST_NOT_EXIST)], [Put("t/b", b"")])
        assert await transactional.get("t/b") is None

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        ("checks", "writes"),
        [
            ([Check("", 1)], []),
            ([Check("t/a", 0)], []),
            ([], [Put("t/\x00", b"")]),
            ([], [Delete("")]),
            ([], [Put("t/a", b"x" * (MAX_VALUE_BYTES + 1))]),
        ],
        ids=["empty-check-key", "check-version-zero", "put-nul", "delete-empty", "too-large"],
    )
    async def test_transact_with_invalid_arguments_raises_value_error_and_writes_nothing(
        self, transactional: MetadataStore, checks: list[Check], writes: list[Put | Delete]
    ) -> None:
        with pytest.raises(ValueError):  # noqa: PT011 - the port's messages vary per argument
            await transactional.transact(checks, [*writes, Put("t/b", b"")])
        assert await keys_of(transactional) == []

    @pytest.mark.asyncio
    async def test_transact_without_the_capability_raises_capability_error(
        self, store: MetadataStore
    ) -> None:
        if store.supports(MetadataStore.MULTI_KEY_TRANSACTION):
            pytest.skip("adapter declares multi_key_transaction")
        with pytest.raises(CapabilityError):
            await store.transact([], [Put("t/a", b"")])

    # --- lifecycle --------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_use_after_close_raises_closed_error(self, store: MetadataStore) -> None:
        await store.put("key", b"")
        await store.close()
        with pytest.raises(ClosedError):
            await store.get("key")
        with pytest.raises(ClosedError):
            await store.put("key", b"")

    @pytest.mark.asyncio
    async def test_data_survives_reopening(
        self, store: MetadataStore, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        record = await store.put("durable", b"v")
        await store.close()
        reopened = await self.open_store(tmp_path, options)
        try:
            assert await reopened.get("durable") == record
        finally:
            await reopened.close()

    # --- against a model --------------------------------------------------------------------

    def test_store_behaves_like_a_sorted_dict(self, tmp_path: Path) -> None:
        # A plain (sync) test: each machine runs its own event loop.
        machine = type(
            "BoundMetadataStoreMachine",
            (MetadataStoreMachine,),
            {"contract": self, "workdir": tmp_path},
        )
        run_state_machine_as_test(machine, settings=self.machine_settings)
