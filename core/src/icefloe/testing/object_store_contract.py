"""The ObjectStore contract suite: the executable form of ``icefloe.ports.object_store``.

A backend opts in with a small class in its tests::

    class TestS3ObjectStore(ObjectStoreContract):
        backend_name = "s3"

        def backend_options(self, workdir, unique):
            return {"bucket": "icefloe-test", "prefix": unique, "endpoint": MOTO_URL}

        async def backdoor_read(self, store, key):  # optional
            ...  # read the object with the SDK, bypassing the adapter

Nothing here assumes a filesystem: the same tests run against the local store and against
S3, GCS and Azure emulators. Each instance gets its own ``unique`` namespace, so tests can
share one server. Keys used here never make one key a folder of another (``a`` next to
``a/b``): a filesystem cannot store that, and the port does not promise it.

The large-object test measures this process's Python allocations (tracemalloc), so an
emulator must run in another process, not as a thread of the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing
import queue
import random
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from icefloe.errors import AlreadyExistsError, NotFoundError
from icefloe.ports.base import PortKind
from icefloe.ports.object_store import MAX_KEY_BYTES, ObjectInfo, ObjectStore
from icefloe.testing.contract import Contract, open_backend

INVALID_KEYS: Final = {
    "empty": "",
    "leading-slash": "/a",
    "trailing-slash": "a/",
    "empty-segment": "a//b",
    "dot-dot": "..",
    "dot-dot-segment": "a/../b",
    "dot-segment": "a/./b",
    "nul": "a\x00b",
    "newline": "a\nb",
    "delete-char": "a\x7fb",
    "too-long": "k" * (MAX_KEY_BYTES + 1),
}
INVALID_PREFIXES: Final = {
    "leading-slash": "/a",
    "empty-segment": "a//",
    "dot-dot": "..",
    "nul": "a\x00",
}

# Keys of the same depth, so that none is a folder of another; they differ right where "/",
# "-", "." and non-ASCII characters sort differently from a per-segment comparison.
MODEL_KEYS: Final = ("a/x", "a/x-1", "a/é", "a-/x", "a0/x", "b/x")
MODEL_PREFIXES: Final = ("a", "a/", "a/x", "a-", "b/", "c")


class SourceFailedError(Exception):
    """Raised by a test's chunk source to interrupt a streamed upload."""


async def chunks_of(parts: Iterable[bytes], fail_after: int | None = None) -> AsyncIterator[bytes]:
    """Yield ``parts`` as an upload source; raise :class:`SourceFailedError` after some."""
    for index, part in enumerate(parts):
        if index == fail_after:
            raise SourceFailedError("the chunk source failed mid-upload")
        yield part


async def keys_of(store: ObjectStore, prefix: str = "") -> list[str]:
    return [info.key async for info in store.list(prefix)]


class ObjectStoreContract(Contract):
    """Generic tests every :class:`ObjectStore` adapter passes; see the module docstring."""

    port_kind: ClassVar[PortKind] = PortKind.OBJECT_STORE

    large_object_size: ClassVar[int] = 100 << 20
    """Size of the object that must stream in and out in bounded memory."""

    # --- what an implementer may override ---------------------------------------------------

    async def backdoor_read(self, store: ObjectStore, key: str) -> bytes | None:
        """The bytes really stored at ``key``, read behind the adapter's back; ``None`` if absent.

        Optional: when provided, writes and deletes are also checked against the real state.
        """
        raise NotImplementedError

    async def open_store(self, workdir: Path, options: dict[str, Any]) -> ObjectStore:
        store = await self.open_backend(workdir, options)
        assert isinstance(store, ObjectStore)
        return store

    # --- fixtures ---------------------------------------------------------------------------

    @pytest.fixture
    def options(self, tmp_path: Path) -> dict[str, Any]:
        return self.backend_options(tmp_path, self.new_unique())

    @pytest_asyncio.fixture
    async def store(self, tmp_path: Path, options: dict[str, Any]) -> AsyncIterator[ObjectStore]:
        store = await self.open_store(tmp_path, options)
        try:
            yield store
        finally:
            await store.close()

    @pytest.fixture
    def shared(self, store: ObjectStore) -> ObjectStore:
        """``store``, when its objects live outside this process (``SHARED``); the tests that
        use other processes or measure this process's memory are skipped otherwise."""
        if not store.supports(ObjectStore.SHARED):
            pytest.skip("adapter does not declare shared: its objects live in this process")
        return store

    async def assert_stored(self, store: ObjectStore, key: str, expected: bytes | None) -> None:
        """Check the real state behind the adapter, when the back door is provided."""
        try:
            actual = await self.backdoor_read(store, key)
        except NotImplementedError:
            return
        assert actual == expected

    # --- put and get ------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_put_then_get_returns_the_bytes(self, store: ObjectStore) -> None:
        await store.put("dir/object", b"hello, object")
        assert await store.get("dir/object") == b"hello, object"
        await self.assert_stored(store, "dir/object", b"hello, object")

    @pytest.mark.asyncio
    async def test_put_reports_key_and_size(self, store: ObjectStore) -> None:
        info = await store.put("dir/object", b"12345")
        assert (info.key, info.size) == ("dir/object", 5)

    @pytest.mark.asyncio
    async def test_put_accepts_a_memoryview(self, store: ObjectStore) -> None:
        await store.put("sliced", memoryview(b"xabcx")[1:4])
        await store.put("mutable", memoryview(bytearray(b"def")))
        assert await store.get("sliced") == b"abc"
        assert await store.get("mutable") == b"def"

    @pytest.mark.asyncio
    async def test_put_rejects_data_that_is_not_bytes(self, store: ObjectStore) -> None:
        with pytest.raises(TypeError):
            await store.put("object", "text")  # type: ignore[arg-type]
        assert await store.head("object") is None

    @pytest.mark.asyncio
    async def test_empty_object_round_trips(self, store: ObjectStore) -> None:
        await store.put("empty", b"")
        assert await store.get("empty") == b""
        info = await store.head("empty")
        assert info is not None
        assert info.size == 0

    @pytest.mark.asyncio
    async def test_put_overwrites_an_existing_object(self, store: ObjectStore) -> None:
        await store.put("object", b"old bytes, longer")
        await store.put("object", b"new")
        assert await store.get("object") == b"new"
        await self.assert_stored(store, "object", b"new")

    @pytest.mark.asyncio
    async def test_get_of_missing_key_raises_not_found(self, store: ObjectStore) -> None:
        with pytest.raises(NotFoundError):
            await store.get("missing/object")

    # --- create if absent -------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_put_if_absent_creates_a_missing_object(self, store: ObjectStore) -> None:
        await store.put("object", b"first", if_absent=True)
        assert await store.get("object") == b"first"

    @pytest.mark.asyncio
    async def test_put_if_absent_on_existing_key_raises_and_keeps_old_bytes(
        self, store: ObjectStore
    ) -> None:
        await store.put("object", b"old")
        with pytest.raises(AlreadyExistsError):
            await store.put("object", b"new", if_absent=True)
        assert await store.get("object") == b"old"
        await self.assert_stored(store, "object", b"old")

    @pytest.mark.asyncio
    async def test_put_if_absent_raced_by_16_writers_has_exactly_one_winner(
        self, store: ObjectStore
    ) -> None:
        # Distinct sizes and bytes per writer, large enough for the writes to overlap.
        payloads = [bytes([index]) * (64 << 10) * (index + 1) for index in range(16)]
        results = await asyncio.gather(
            *(store.put("race/object", data, if_absent=True) for data in payloads),
            return_exceptions=True,
        )
        winners = [
            data
            for data, result in zip(payloads, results, strict=True)
            if not isinstance(result, BaseException)
        ]
        losers = [result for result in results if isinstance(result, BaseException)]
        assert len(winners) == 1
        assert all(isinstance(loser, AlreadyExistsError) for loser in losers), losers
        assert await store.get("race/object") == winners[0]
        await self.assert_stored(store, "race/object", winners[0])

    # --- ranged reads -----------------------------------------------------------------------

    @pytest_asyncio.fixture
    async def digits(self, store: ObjectStore) -> ObjectStore:
        """A store holding ``digits`` = b"0123456789"."""
        await store.put("digits", b"0123456789")
        return store

    @pytest.mark.asyncio
    async def test_get_range_from_the_start(self, digits: ObjectStore) -> None:
        assert await digits.get("digits", 0, 4) == b"0123"

    @pytest.mark.asyncio
    async def test_get_range_in_the_middle(self, digits: ObjectStore) -> None:
        assert await digits.get("digits", 3, 7) == b"3456"

    @pytest.mark.asyncio
    async def test_get_range_end_is_clipped_at_the_size(self, digits: ObjectStore) -> None:
        assert await digits.get("digits", 7, 100) == b"789"

    @pytest.mark.asyncio
    @pytest.mark.parametrize("start", [10, 11, 1000])
    async def test_get_range_starting_at_or_past_the_size_is_empty(
        self, digits: ObjectStore, start: int
    ) -> None:
        assert await digits.get("digits", start, start + 5) == b""
        assert await digits.get("digits", start) == b""

    @pytest.mark.asyncio
    async def test_get_with_end_none_reads_to_the_end(self, digits: ObjectStore) -> None:
        assert await digits.get("digits", 6) == b"6789"
        assert await digits.get("digits", 6, None) == b"6789"

    @pytest.mark.asyncio
    @pytest.mark.parametrize(("start", "end"), [(-1, 4), (5, 4)])
    async def test_get_rejects_a_negative_or_inverted_range(
        self, digits: ObjectStore, start: int, end: int
    ) -> None:
        with pytest.raises(ValueError, match="range"):
            await digits.get("digits", start, end)

    @pytest.mark.asyncio
    async def test_get_range_of_missing_key_raises_not_found(self, store: ObjectStore) -> None:
        with pytest.raises(NotFoundError):
            await store.get("missing", 2, 5)

    @pytest.mark.asyncio
    @pytest.mark.parametrize(
        ("start", "end", "expected"),
        [(0, 4, b"0123"), (3, 7, b"3456"), (7, 100, b"789"), (6, None, b"6789"), (10, 15, b"")],
    )
    async def test_get_view_holds_what_get_returns(
        self, digits: ObjectStore, start: int, end: int | None, expected: bytes
    ) -> None:
        view = await digits.get_view("digits", start, end)
        assert isinstance(view, memoryview)
        assert view.tobytes() == expected

    @pytest.mark.asyncio
    async def test_get_view_of_missing_key_raises_not_found(self, store: ObjectStore) -> None:
        with pytest.raises(NotFoundError):
            await store.get_view("missing", 2, 5)

    @pytest.mark.asyncio
    async def test_a_writable_view_is_the_readers_own(self, digits: ObjectStore) -> None:
        view = await digits.get_view("digits", 2, 6)
        if not view.readonly:
            view[:] = b"xxxx"
        assert await digits.get("digits") == b"0123456789"
        assert (await digits.get_view("digits", 2, 6)).tobytes() == b"2345"

    # --- head -------------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_head_of_present_object_reports_its_size(self, store: ObjectStore) -> None:
        await store.put("dir/object", b"x" * 1234)
        info = await store.head("dir/object")
        assert info is not None
        assert (info.key, info.size) == ("dir/object", 1234)

    @pytest.mark.asyncio
    async def test_head_reports_a_modified_time_close_to_now(self, store: ObjectStore) -> None:
        before = time.time()
        await store.put("object", b"x")
        info = await store.head("object")
        assert info is not None
        # Generous slack: servers keep their own clock and may round to whole seconds.
        assert before - 60 <= info.modified <= time.time() + 60

    @pytest.mark.asyncio
    async def test_head_of_missing_key_is_none(self, store: ObjectStore) -> None:
        assert await store.head("missing/object") is None

    # --- list -------------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_list_is_in_key_order(self, store: ObjectStore) -> None:
        keys = ["k/a/b", "k/a-b", "k/a.b", "k/A", "k/é", "k/ab", "k/a0", "k/~", "k/a/b-c"]
        for key in keys:
            await store.put(key, key.encode())
        assert await keys_of(store, "k/") == sorted(keys, key=lambda key: key.encode())

    @pytest.mark.asyncio
    async def test_list_with_a_folder_prefix_returns_only_that_folder(
        self, store: ObjectStore
    ) -> None:
        for key in ["logs/1", "logs/2", "logs/sub/3", "logs-old/4", "logsx", "other/5"]:
            await store.put(key, b"x")
        assert await keys_of(store, "logs/") == ["logs/1", "logs/2", "logs/sub/3"]

    @pytest.mark.asyncio
    async def test_list_with_a_partial_segment_prefix_matches_across_folders(
        self, store: ObjectStore
    ) -> None:
        for key in ["logs/1", "logs-old/4", "logsx", "other/5", "data/logs/6"]:
            await store.put(key, b"x")
        assert await keys_of(store, "logs") == ["logs-old/4", "logs/1", "logsx"]
        assert await keys_of(store, "logs/s") == []

    @pytest.mark.asyncio
    async def test_list_with_an_empty_prefix_returns_every_object(self, store: ObjectStore) -> None:
        for key in ["b/2", "a/1", "c"]:
            await store.put(key, b"x")
        assert await keys_of(store) == ["a/1", "b/2", "c"]

    @pytest.mark.asyncio
    async def test_list_reports_sizes(self, store: ObjectStore) -> None:
        await store.put("sized/one", b"1")
        await store.put("sized/three", b"333")
        found = [(info.key, info.size) async for info in store.list("sized/")]
        assert found == [("sized/one", 1), ("sized/three", 3)]

    @pytest.mark.asyncio
    async def test_list_with_no_match_is_empty(self, store: ObjectStore) -> None:
        await store.put("present/object", b"x")
        assert await keys_of(store, "absent/") == []
        assert await keys_of(store, "present/object/") == []

    @pytest.mark.asyncio
    async def test_list_of_an_empty_store_is_empty(self, store: ObjectStore) -> None:
        assert await keys_of(store) == []

    # --- delete -----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_delete_removes_the_object(self, store: ObjectStore) -> None:
        await store.put("dir/object", b"x")
        await store.delete("dir/object")
        with pytest.raises(NotFoundError):
            await store.get("dir/object")
        assert await store.head("dir/object") is None
        assert await keys_of(store) == []
        await self.assert_stored(store, "dir/object", None)

    @pytest.mark.asyncio
    async def test_delete_of_missing_key_is_not_an_error(self, store: ObjectStore) -> None:
        await store.delete("never/written")

    @pytest.mark.asyncio
    async def test_delete_twice_is_not_an_error(self, store: ObjectStore) -> None:
        await store.put("object", b"x")
        await store.delete("object")
        await store.delete("object")
        assert await store.head("object") is None

    @pytest.mark.asyncio
    async def test_delete_keeps_the_other_objects(self, store: ObjectStore) -> None:
        for key in ["d/x/1", "d/x/2", "d/y/1", "d/x-1"]:
            await store.put(key, key.encode())
        await store.delete("d/x/1")
        assert await keys_of(store) == ["d/x-1", "d/x/2", "d/y/1"]
        assert await store.get("d/x/2") == b"d/x/2"

    @pytest.mark.asyncio
    async def test_put_after_deleting_the_last_object_under_a_prefix(
        self, store: ObjectStore
    ) -> None:
        await store.put("deep/folder/object", b"one")
        await store.delete("deep/folder/object")
        await store.put("deep/folder/object", b"two")
        assert await store.get("deep/folder/object") == b"two"

    # --- streams ----------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_put_stream_round_trips_a_multi_chunk_object(self, store: ObjectStore) -> None:
        parts = [bytes([index]) * (100_000 + index) for index in range(7)]
        info = await store.put_stream("streamed", chunks_of(parts))
        assert info.size == sum(map(len, parts))
        assert await store.get("streamed") == b"".join(parts)
        await self.assert_stored(store, "streamed", b"".join(parts))

    @pytest.mark.asyncio
    async def test_put_stream_of_no_chunks_stores_an_empty_object(self, store: ObjectStore) -> None:
        await store.put_stream("empty", chunks_of([]))
        assert await store.get("empty") == b""

    @pytest.mark.asyncio
    async def test_put_stream_if_absent_creates_a_missing_object(self, store: ObjectStore) -> None:
        await store.put_stream("object", chunks_of([b"ab", b"cd"]), if_absent=True)
        assert await store.get("object") == b"abcd"

    @pytest.mark.asyncio
    async def test_put_stream_if_absent_on_existing_key_raises_and_keeps_old_bytes(
        self, store: ObjectStore
    ) -> None:
        await store.put("object", b"old")
        with pytest.raises(AlreadyExistsError):
            await store.put_stream("object", chunks_of([b"ne", b"w"]), if_absent=True)
        assert await store.get("object") == b"old"

    @pytest.mark.asyncio
    async def test_put_stream_interrupted_by_its_source_stores_nothing(
        self, store: ObjectStore
    ) -> None:
        with pytest.raises(SourceFailedError):
            await store.put_stream("object", chunks_of([b"x" * 1000] * 5, fail_after=3))
        assert await store.head("object") is None
        assert await keys_of(store) == []

    @pytest.mark.asyncio
    async def test_put_stream_interrupted_by_its_source_keeps_the_previous_object(
        self, store: ObjectStore
    ) -> None:
        await store.put("object", b"previous")
        with pytest.raises(SourceFailedError):
            await store.put_stream("object", chunks_of([b"x" * 1000] * 5, fail_after=3))
        assert await store.get("object") == b"previous"

    @pytest.mark.asyncio
    async def test_get_stream_yields_bounded_chunks_that_join_to_the_object(
        self, store: ObjectStore
    ) -> None:
        data = random.Random(1).randbytes(10_000)
        await store.put("object", data)
        chunks = [chunk async for chunk in store.get_stream("object", chunk_size=3000)]
        assert all(0 < len(chunk) <= 3000 for chunk in chunks)
        assert b"".join(chunks) == data

    @pytest.mark.asyncio
    async def test_get_stream_of_missing_key_raises_not_found(self, store: ObjectStore) -> None:
        with pytest.raises(NotFoundError):
            async for _ in store.get_stream("missing"):
                pass

    @pytest.mark.asyncio
    async def test_large_object_streams_in_and_out_in_bounded_memory(
        self, shared: ObjectStore
    ) -> None:
        store = shared
        size, part_size = self.large_object_size, 1 << 20
        sent, received = hashlib.sha256(), hashlib.sha256()

        async def source() -> AsyncIterator[bytes]:
            rng = random.Random(7)
            for _ in range(size // part_size):
                part = rng.randbytes(part_size)
                sent.update(part)
                yield part

        with _traced_peak() as peak_in:
            info = await store.put_stream("large", source())
        received_size = 0
        with _traced_peak() as peak_out:
            async for chunk in store.get_stream("large"):
                received.update(chunk)
                received_size += len(chunk)
        assert info.size == received_size == size
        assert received.hexdigest() == sent.hexdigest()
        # Holding the object once would already be `size`; bounded streaming stays far below.
        assert peak_in.bytes < size // 2, f"put_stream peaked at {peak_in.bytes:,} bytes"
        assert peak_out.bytes < size // 2, f"get_stream peaked at {peak_out.bytes:,} bytes"

    # --- other processes --------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_put_if_absent_raced_by_several_processes_has_exactly_one_winner(
        self, shared: ObjectStore, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        store = shared
        processes, tasks = 4, 4
        outcomes = await asyncio.to_thread(
            race_in_processes, self.backend_name, tmp_path, options, processes, tasks
        )
        assert len(outcomes) == processes * tasks
        winners = [writer for writer, status in outcomes if status == "won"]
        assert len(winners) == 1, outcomes
        assert all(status in ("won", "lost") for _, status in outcomes), outcomes
        assert await store.get(RACE_KEY) == race_payload(winners[0])
        await self.assert_stored(store, RACE_KEY, race_payload(winners[0]))

    @pytest.mark.asyncio
    async def test_writer_killed_mid_stream_leaves_no_object(
        self, shared: ObjectStore, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        store = shared
        await asyncio.to_thread(kill_writer_mid_stream, self.backend_name, tmp_path, options)
        assert await store.head(CRASH_KEY) is None
        assert await keys_of(store) == []
        with pytest.raises(NotFoundError):
            await store.get(CRASH_KEY)
        await self.assert_stored(store, CRASH_KEY, None)

    @pytest.mark.asyncio
    async def test_writer_killed_mid_overwrite_keeps_the_previous_object(
        self, shared: ObjectStore, tmp_path: Path, options: dict[str, Any]
    ) -> None:
        store = shared
        await store.put(CRASH_KEY, b"previous")
        await asyncio.to_thread(kill_writer_mid_stream, self.backend_name, tmp_path, options)
        assert await keys_of(store) == [CRASH_KEY]
        assert await store.get(CRASH_KEY) == b"previous"

    # --- counters ---------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_counters_match_known_operations(self, store: ObjectStore) -> None:
        before = store.stats.snapshot()
        await store.put("count/a", b"x" * 10)
        await store.put("count/b", b"y" * 20)
        await store.get("count/a")
        await store.get("count/b", 5, 10)
        await keys_of(store, "count/")
        await store.head("count/b")
        await store.delete("count/a")
        delta = _stats_delta(before, store.stats.snapshot())
        assert delta["requests"] == {"PUT": 2, "GET": 2, "HEAD": 1, "LIST": 1, "DELETE": 1}
        assert (delta["bytes"]["PUT"], delta["bytes"]["GET"]) == (30, 15)

    @pytest.mark.asyncio
    async def test_counters_count_streamed_bytes(self, store: ObjectStore) -> None:
        parts = [b"p" * 70_000] * 3
        before = store.stats.snapshot()
        await store.put_stream("count/streamed", chunks_of(parts))
        received = [chunk async for chunk in store.get_stream("count/streamed", chunk_size=50_000)]
        delta = _stats_delta(before, store.stats.snapshot())
        assert (delta["bytes"]["PUT"], delta["bytes"]["GET"]) == (210_000, 210_000)
        assert delta["requests"]["PUT"] >= 1
        assert delta["requests"]["GET"] >= 1
        assert b"".join(received) == b"".join(parts)

    # --- invalid input ----------------------------------------------------------------------

    @pytest.mark.asyncio
    @pytest.mark.parametrize("key", INVALID_KEYS.values(), ids=INVALID_KEYS.keys())
    async def test_invalid_key_is_rejected_by_put(self, store: ObjectStore, key: str) -> None:
        with pytest.raises(ValueError, match="key"):
            await store.put(key, b"x")
        with pytest.raises(ValueError, match="key"):
            await store.put_stream(key, chunks_of([b"x"]))
        assert await keys_of(store) == []

    @pytest.mark.asyncio
    @pytest.mark.parametrize("key", INVALID_KEYS.values(), ids=INVALID_KEYS.keys())
    async def test_invalid_key_is_rejected_by_reads_and_delete(
        self, store: ObjectStore, key: str
    ) -> None:
        with pytest.raises(ValueError, match="key"):
            await store.get(key)
        with pytest.raises(ValueError, match="key"):
            store.get_stream(key)
        with pytest.raises(ValueError, match="key"):
            await store.head(key)
        with pytest.raises(ValueError, match="key"):
            await store.delete(key)

    @pytest.mark.asyncio
    @pytest.mark.parametrize("prefix", INVALID_PREFIXES.values(), ids=INVALID_PREFIXES.keys())
    async def test_invalid_prefix_is_rejected_by_list(
        self, store: ObjectStore, prefix: str
    ) -> None:
        with pytest.raises(ValueError, match="key"):
            store.list(prefix)

    # --- model-based ------------------------------------------------------------------------

    def test_behaves_like_an_in_memory_dict(self, tmp_path: Path) -> None:
        contract = self

        class Machine(ObjectStoreModelMachine):
            def __init__(self) -> None:
                super().__init__(contract, tmp_path)

        run_state_machine_as_test(
            Machine,
            settings=settings(
                max_examples=25,
                stateful_step_count=20,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )


class ObjectStoreModelMachine(RuleBasedStateMachine):
    """Runs random operations on a fresh store and on a dict, and compares every answer.

    Hypothesis drives synchronous rules, so the machine owns an event loop
    (``asyncio.Runner``) and runs each store call to completion on it.
    """

    def __init__(self, contract: ObjectStoreContract, workdir: Path) -> None:
        super().__init__()
        self.model: dict[str, bytes] = {}
        self.runner = asyncio.Runner()
        unique = contract.new_unique()
        workdir = workdir / unique
        workdir.mkdir()
        try:
            options = contract.backend_options(workdir, unique)
            self.store = self.runner.run(contract.open_store(workdir, options))
        except BaseException:
            self.runner.close()
            raise

    def teardown(self) -> None:
        try:
            self.runner.run(self.store.close())
        finally:
            self.runner.close()

    @rule(key=st.sampled_from(MODEL_KEYS), data=st.binary(max_size=64))
    def put(self, key: str, data: bytes) -> None:
        assert self.runner.run(self.store.put(key, data)).size == len(data)
        self.model[key] = data

    @rule(key=st.sampled_from(MODEL_KEYS), data=st.binary(max_size=64))
    def put_if_absent(self, key: str, data: bytes) -> None:
        if key in self.model:
            with pytest.raises(AlreadyExistsError):
                self.runner.run(self.store.put(key, data, if_absent=True))
        else:
            self.runner.run(self.store.put(key, data, if_absent=True))
            self.model[key] = data

    @rule(
        key=st.sampled_from(MODEL_KEYS),
        parts=st.lists(st.binary(min_size=1, max_size=16), max_size=4),
    )
    def put_stream(self, key: str, parts: list[bytes]) -> None:
        self.runner.run(self.store.put_stream(key, chunks_of(parts)))
        self.model[key] = b"".join(parts)

    @rule(
        key=st.sampled_from(MODEL_KEYS),
        start=st.integers(0, 80),
        length=st.none() | st.integers(1, 80),
    )
    def get(self, key: str, start: int, length: int | None) -> None:
        end = None if length is None else start + length
        if key in self.model:
            assert self.runner.run(self.store.get(key, start, end)) == self.model[key][start:end]
        else:
            with pytest.raises(NotFoundError):
                self.runner.run(self.store.get(key, start, end))

    @rule(key=st.sampled_from(MODEL_KEYS))
    def head(self, key: str) -> None:
        info = self.runner.run(self.store.head(key))
        if key in self.model:
            assert info is not None
            assert (info.key, info.size) == (key, len(self.model[key]))
        else:
            assert info is None

    @rule(key=st.sampled_from(MODEL_KEYS))
    def delete(self, key: str) -> None:
        self.runner.run(self.store.delete(key))
        self.model.pop(key, None)

    @rule(prefix=st.sampled_from(MODEL_PREFIXES))
    def list_prefix(self, prefix: str) -> None:
        self.check_listing(prefix)

    @invariant()
    def listing_matches_the_model(self) -> None:
        self.check_listing("")

    def check_listing(self, prefix: str) -> None:
        found = self.runner.run(_collect(self.store.list(prefix)))
        expected = sorted(
            ((key, len(data)) for key, data in self.model.items() if key.startswith(prefix)),
            key=lambda item: item[0].encode(),
        )
        assert [(info.key, info.size) for info in found] == expected


async def _collect(infos: AsyncIterator[ObjectInfo]) -> list[ObjectInfo]:
    return [info async for info in infos]


def _stats_delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    return {
        group: {kind: after[group][kind] - before[group][kind] for kind in after[group]}
        for group in after
    }


@dataclass
class _Peak:
    bytes: int = 0


@contextlib.contextmanager
def _traced_peak() -> Iterator[_Peak]:
    """Peak Python allocation (all threads) inside the block, above what was live before it."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    peak = _Peak()
    try:
        yield peak
    finally:
        peak.bytes = tracemalloc.get_traced_memory()[1] - baseline
        if started:
            tracemalloc.stop()


# --- child processes ------------------------------------------------------------------------
# Module-level functions, so that a 'spawn'-ed child can import them. Each child opens the
# backend from the same options dict, as a second broker process would.

RACE_KEY: Final = "race/object"
CRASH_KEY: Final = "crash/object"
CHILD_TIMEOUT: Final = 60.0
_STREAMED_BEFORE_KILL: Final = 12 << 20
"""Enough for a multipart upload to have sent a part or two (parts are usually 5-8 MiB)."""


def race_payload(writer: int) -> bytes:
    """The distinct bytes that racing writer number ``writer`` tries to create."""
    return bytes([writer]) * (256 << 10)


def race_in_processes(
    backend_name: str, workdir: Path, options: dict[str, Any], processes: int, tasks: int
) -> list[tuple[int, str]]:
    """Race ``processes`` × ``tasks`` create-if-absent writers; ``(writer, "won"|"lost"|…)``."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(processes)
    results = spawn.Queue()
    children = [
        spawn.Process(
            target=_race_child,
            args=(
                backend_name,
                str(workdir),
                options,
                range(p * tasks, (p + 1) * tasks),
                barrier,
                results,
            ),
            daemon=True,
        )
        for p in range(processes)
    ]
    for child in children:
        child.start()
    try:
        outcomes: list[tuple[int, str]] = []
        for _ in children:
            outcomes.extend(_next_result(results, children))
        return outcomes
    finally:
        _reap(children)


def kill_writer_mid_stream(backend_name: str, workdir: Path, options: dict[str, Any]) -> None:
    """Start a child streaming into :data:`CRASH_KEY` and SIGKILL it while the upload runs."""
    spawn = multiprocessing.get_context("spawn")
    streaming = spawn.Event()
    child = spawn.Process(
        target=_stream_forever_child,
        args=(backend_name, str(workdir), options, streaming),
        daemon=True,
    )
    child.start()
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while not streaming.wait(0.1):
            assert child.is_alive(), f"the writer exited with {child.exitcode} before streaming"
            assert time.monotonic() < deadline, "the writer never started streaming"
    finally:
        _reap([child])


def _next_result(results: Any, children: list[Any]) -> list[tuple[int, str]]:
    deadline = time.monotonic() + CHILD_TIMEOUT
    while time.monotonic() < deadline:
        with contextlib.suppress(queue.Empty):
            result: list[tuple[int, str]] = results.get(timeout=0.2)
            return result
        if not any(child.is_alive() for child in children):
            with contextlib.suppress(queue.Empty):
                result = results.get(timeout=1.0)  # the last one may still be in the pipe
                return result
            raise AssertionError(f"a child died: exit codes {[c.exitcode for c in children]}")
    raise AssertionError("a racing child did not report in time")


def _reap(children: list[Any]) -> None:
    for child in children:
        if child.is_alive():
            child.kill()
        child.join(CHILD_TIMEOUT)


def _race_child(
    backend_name: str,
    workdir: str,
    options: dict[str, Any],
    writers: range,
    barrier: Any,
    results: Any,
) -> None:
    async def race() -> list[tuple[int, str]]:
        store = await _open_in_child(backend_name, workdir, options)
        try:
            barrier.wait(CHILD_TIMEOUT)  # every process is ready: start together
            outcomes = await asyncio.gather(
                *(store.put(RACE_KEY, race_payload(w), if_absent=True) for w in writers),
                return_exceptions=True,
            )
        finally:
            await store.close()
        return [(w, _race_status(o)) for w, o in zip(writers, outcomes, strict=True)]

    results.put(asyncio.run(race()))


def _race_status(outcome: object) -> str:
    if isinstance(outcome, AlreadyExistsError):
        return "lost"
    if isinstance(outcome, BaseException):
        return f"failed: {outcome!r}"
    return "won"


def _stream_forever_child(
    backend_name: str, workdir: str, options: dict[str, Any], streaming: Any
) -> None:
    async def endless() -> AsyncIterator[bytes]:
        part = b"partial!" * (128 << 10)
        sent = 0
        while True:
            yield part
            sent += len(part)
            if sent >= _STREAMED_BEFORE_KILL:
                streaming.set()
                await asyncio.sleep(0.05)

    async def write() -> None:
        store = await _open_in_child(backend_name, workdir, options)
        await store.put_stream(CRASH_KEY, endless())

    asyncio.run(write())


async def _open_in_child(backend_name: str, workdir: str, options: dict[str, Any]) -> ObjectStore:
    store = await open_backend(PortKind.OBJECT_STORE, backend_name, Path(workdir), options)
    assert isinstance(store, ObjectStore)
    return store
