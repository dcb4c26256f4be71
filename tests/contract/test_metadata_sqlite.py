"""The embedded SQLite metadata store runs the MetadataStore contract, plus what only it has."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from icefloe.embedded import sqlite_metadata
from icefloe.embedded.sqlite_metadata import SqliteMetadataOptions, SqliteMetadataStore
from icefloe.errors import AlreadyExistsError, ClosedError, UnavailableError
from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import (
    MUST_NOT_EXIST,
    RESET,
    EventKind,
    MetadataStore,
    Record,
    SequenceAppend,
)
from icefloe.testing.metadata_contract import (
    MetadataStoreContract,
    events_until,
    next_event,
)


class TestSqliteMetadataStore(MetadataStoreContract):
    backend_name = "sqlite"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        # A file per instance isolates tests; a fast reaper keeps the expiry tests short.
        return {"path": str(workdir / "meta.db"), "reap_interval": 0.05}

    async def backdoor_get(self, store: MetadataStore, key: str) -> bytes | None:
        assert isinstance(store, SqliteMetadataStore)
        return await asyncio.to_thread(read_value, store.path, key)

    # --- SQLite only --------------------------------------------------------------------------

    @pytest.mark.asyncio
    async def test_default_file_is_metadata_db_in_the_data_dir(self, tmp_path: Path) -> None:
        data_dir = tmp_path / "not" / "yet" / "there"
        store = await self.open_store(data_dir, {})
        try:
            await store.put("key", b"v")
        finally:
            await store.close()
        assert read_value(data_dir / "metadata.db", "key") == b"v"

    @pytest.mark.asyncio
    async def test_operations_are_timed_and_failures_but_not_conflicts_counted(
        self, tmp_path: Path
    ) -> None:
        store = await self.open_store(tmp_path, self.backend_options(tmp_path, ""))
        before = {name: _op_metric(name, "put") for name in ("seconds_count", "failures_total")}
        try:
            await store.put("k", b"v")
            with pytest.raises(AlreadyExistsError):
                await store.put("k", b"w", expected_version=MUST_NOT_EXIST)
        finally:
            await store.close()
        with pytest.raises(ClosedError):
            await store.put("k", b"x")
        assert _op_metric("seconds_count", "put") - before["seconds_count"] == 3
        assert _op_metric("failures_total", "put") - before["failures_total"] == 1  # the closed

    @pytest.mark.asyncio
    async def test_appends_made_together_share_a_commit_and_one_failing_leaves_the_others(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = await self.open_store(tmp_path, self.backend_options(tmp_path, ""))
        try:
            await store.append_sequence("two", b"", [1, 1])
            groups = count_calls(monkeypatch, "run_group")
            outcomes = await store.append_sequences(
                [
                    SequenceAppend("one", b"a", (1,)),
                    SequenceAppend("two", b"wrong", (1,)),  # the sequence has two components
                    SequenceAppend("one", b"b", (1,)),
                ]
            )
            assert groups.count == 1
            first, failed, second = outcomes
            assert isinstance(failed, ValueError)
            assert isinstance(first, Record)
            assert isinstance(second, Record)
            assert [r.key for r in await store.scan("one", "one~")] == [first.key, second.key]
            assert len(await store.scan("two", "two~")) == 1
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_unknown_option_is_rejected(self, tmp_path: Path) -> None:
        with pytest.raises(ValidationError, match="pol_interval"):
            await self.open_store(tmp_path, {"pol_interval": 1})

    @pytest.mark.asyncio
    async def test_two_stores_on_one_file_see_each_others_writes(self, tmp_path: Path) -> None:
        options = self.backend_options(tmp_path, "")
        first = await self.open_store(tmp_path, options)
        second = await self.open_store(tmp_path, options)
        try:
            async with first.watch("k/") as watch:
                record = await second.put("k/1", b"v")
                event = await next_event(watch)
            assert (event.kind, event.key, event.version) == (EventKind.PUT, "k/1", record.version)
            assert await first.get("k/1") == record
        finally:
            await first.close()
            await second.close()

    @pytest.mark.asyncio
    async def test_watcher_that_does_not_read_gets_reset_when_its_queue_overflows(
        self, tmp_path: Path
    ) -> None:
        options = {**self.backend_options(tmp_path, ""), "watch_queue_size": 4}
        store = await self.open_store(tmp_path, options)
        try:
            slow = await store.watch("w/")
            # Fed by the same pump as ``slow``: once it has seen a change, so has ``slow``.
            async with store.watch("w/") as barrier:
                keys = [f"w/{i:02d}" for i in range(10)]
                for key in keys:
                    await store.put(key, b"")
                await events_until(barrier, keys[-1])
            assert await next_event(slow) == RESET
            await store.put("w/after", b"")
            assert (await events_until(slow, "w/after"))[-1].kind is EventKind.PUT
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_watcher_behind_the_pruned_changelog_gets_reset(self, tmp_path: Path) -> None:
        options = {**self.backend_options(tmp_path, ""), "changelog_retention": 4}
        # This store never polls nor listens: it learns of the other store's changes only
        # when it commits itself, long after they were pruned.
        never = {"poll_interval": 3600, "listen_for_writes": False}
        watching = await self.open_store(tmp_path, {**options, **never})
        writing = await self.open_store(tmp_path, options)
        try:
            async with watching.watch("w/") as watch:
                for i in range(10):
                    await writing.put(f"w/{i}", b"")
                await watching.put("w/local", b"")
                assert await next_event(watch) == RESET
                await watching.put("w/next", b"")
                event = await next_event(watch)
            assert (event.kind, event.key) == (EventKind.PUT, "w/next")
        finally:
            await watching.close()
            await writing.close()

    @pytest.mark.asyncio
    async def test_changelog_keeps_only_the_newest_changes(self, tmp_path: Path) -> None:
        options = {**self.backend_options(tmp_path, ""), "changelog_retention": 5}
        store = await self.open_store(tmp_path, options)
        try:
            for i in range(20):
                await store.put(f"k/{i}", b"")
        finally:
            await store.close()
        with contextlib.closing(sqlite3.connect(options["path"])) as db:
            ids = [row[0] for row in db.execute("SELECT id FROM changes ORDER BY id")]
            (keys,) = db.execute("SELECT count(*) FROM kv").fetchone()
        assert len(ids) == 5
        assert keys == 20

    @pytest.mark.asyncio
    async def test_write_while_another_process_holds_the_lock_is_unavailable(
        self, tmp_path: Path
    ) -> None:
        options = {**self.backend_options(tmp_path, ""), "busy_timeout": 0.1}
        store = await self.open_store(tmp_path, options)
        blocker = sqlite3.connect(options["path"], isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(UnavailableError) as raised:
                await store.put("key", b"v")
            assert raised.value.retriable
            assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
            blocker.execute("ROLLBACK")
            await store.put("key", b"v")  # and it recovers once the lock is gone
        finally:
            blocker.close()
            await store.close()

    def test_a_full_disk_is_unavailable_until_space_is_freed(self, tmp_path: Path) -> None:
        path = tmp_path / "full.db"
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("CREATE TABLE t (v BLOB)")
            db.execute("PRAGMA max_page_count = 3")  # no room to grow: SQLite's full disk

            def write() -> object:
                return db.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))

            with pytest.raises(UnavailableError, match="disk is full") as raised:
                sqlite_metadata._translated(path, write)
            assert raised.value.retriable  # a write refused whole: retried once space is back
            db.execute("PRAGMA max_page_count = 1000")
            sqlite_metadata._translated(path, write)
            assert db.execute("SELECT count(*) FROM t").fetchone() == (1,)
        finally:
            db.close()

    def test_stores_opening_a_new_file_together_all_open(self, tmp_path: Path) -> None:
        # Brokers of one `serve` open the same fresh file at once; SQLite can answer the
        # loser of a lock deadlock BUSY without waiting, which once failed a broker's start.
        async def open_and_close(options: dict[str, Any]) -> None:
            store = await self.open_store(tmp_path, options)
            await store.close()

        def open_when_all_are_ready(options: dict[str, Any], ready: threading.Barrier) -> None:
            ready.wait()
            asyncio.run(open_and_close(options))

        with ThreadPoolExecutor(4) as pool:
            for attempt in range(60):
                options = {"path": str(tmp_path / f"fresh-{attempt}.db")}
                ready = threading.Barrier(4)
                opening = [pool.submit(open_when_all_are_ready, options, ready) for _ in range(4)]
                for future in opening:
                    future.result()  # raises what the open raised

    @pytest.mark.asyncio
    async def test_a_failed_write_among_concurrent_ones_fails_alone(self, tmp_path: Path) -> None:
        # Concurrent writes share one transaction (one fsync); each still stands on its own.
        store = await self.open_store(tmp_path, self.backend_options(tmp_path, ""))
        try:
            await store.put("taken", b"old")
            writes = [store.put(f"k/{i:02d}", b"v") for i in range(40)]
            writes.insert(20, store.put("taken", b"new", expected_version=MUST_NOT_EXIST))
            results = await asyncio.gather(*writes, return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            assert len(failed) == 1
            assert isinstance(failed[0], AlreadyExistsError)
            assert len(await store.scan("k/", "k0")) == 40
            assert (await store.get("taken")).value == b"old"  # type: ignore[union-attr]
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_close_deletes_the_keys_of_open_sessions(self, tmp_path: Path) -> None:
        options = self.backend_options(tmp_path, "")
        store = await self.open_store(tmp_path, options)
        session = await store.open_session(10)
        await store.put("live/key", b"", session=session)
        await store.close()
        assert session.lost.done()
        assert read_value(Path(options["path"]), "live/key") is None

    @pytest.mark.asyncio
    async def test_a_commit_hands_the_watchers_its_changes_without_another_read(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        read = count_calls(monkeypatch, "read_changes")
        committed_and_read = count_calls(monkeypatch, "run_group_and_read_changes")

        def reads_alone() -> int:
            return read.count - committed_and_read.count

        store = await self.open_store(tmp_path, self.backend_options(tmp_path, ""))
        try:
            async with store.watch("k/") as watch:
                await store.put("k/0", b"")
                await events_until(watch, "k/0")
                # The pump reads once for a new watcher, and again at its first poll.
                await asyncio.sleep(0.3)
                before = reads_alone()
                for i in range(1, 6):
                    record = await store.put(f"k/{i}", b"v")
                    event = await next_event(watch)
                    assert (event.key, event.version) == (f"k/{i}", record.version)
                assert reads_alone() == before, "the watch pump read the change log again"
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_a_local_commit_brings_the_watchers_other_processes_changes_too(
        self, tmp_path: Path
    ) -> None:
        options = self.backend_options(tmp_path, "")
        # This store never polls nor listens: only its own commit can bring the other's change.
        never = {"poll_interval": 3600, "listen_for_writes": False}
        watching = await self.open_store(tmp_path, {**options, **never})
        writing = await self.open_store(tmp_path, options)
        try:
            async with watching.watch("w/") as watch:
                theirs = await writing.put("w/theirs", b"")
                mine = await watching.put("w/mine", b"")
                events = await events_until(watch, "w/mine")
            assert [(e.key, e.version) for e in events] == [
                ("w/theirs", theirs.version),
                ("w/mine", mine.version),
            ]
        finally:
            await watching.close()
            await writing.close()

    @pytest.mark.asyncio
    async def test_a_quiet_store_asks_for_changes_only_when_it_hears_a_write(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # With the safety-net check an hour away, the change can only arrive by being heard.
        monkeypatch.setattr(sqlite_metadata, "QUIET_AFTER_S", 0.05)
        monkeypatch.setattr(sqlite_metadata, "IDLE_CHECK_S", 3600.0)
        asked = count_calls(monkeypatch, "data_version")
        options = self.backend_options(tmp_path, "")
        first = await self.open_store(tmp_path, options)
        second = await self.open_store(tmp_path, options)
        try:
            async with first.watch("k/") as watch:
                await asyncio.sleep(0.5)  # long past QUIET_AFTER_S
                asked_at_rest = asked.count
                await asyncio.sleep(0.5)
                assert asked.count == asked_at_rest, "nobody wrote, yet the store asked"
                record = await second.put("k/1", b"v")
                event = await next_event(watch)
            assert (event.kind, event.key, event.version) == (EventKind.PUT, "k/1", record.version)
        finally:
            await first.close()
            await second.close()

    @pytest.mark.asyncio
    async def test_a_store_that_does_not_listen_asks_every_poll_interval(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        asked = count_calls(monkeypatch, "data_version")
        options = {**self.backend_options(tmp_path, ""), "listen_for_writes": False}
        store = await self.open_store(tmp_path, options)
        try:
            async with store.watch("k/"):
                await asyncio.sleep(0.5)
                asked_at_rest = asked.count
                await asyncio.sleep(0.5)  # 50 poll intervals of 10 ms
                assert asked.count - asked_at_rest >= 10
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_a_process_that_may_hear_late_asks_less_often(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        asked = count_calls(monkeypatch, "data_version")
        options = {**self.backend_options(tmp_path, ""), "listen_for_writes": False}
        context = OpenContext(data_dir=tmp_path, watch_delay_s=0.25)
        store = await SqliteMetadataStore.open(SqliteMetadataOptions(**options), context)
        try:
            async with store.watch("k/"):
                await asyncio.sleep(0.3)
                asked_at_rest = asked.count
                await asyncio.sleep(1.0)  # 100 of the configured intervals, 4 of the delay
                assert asked.count - asked_at_rest <= 5
        finally:
            await store.close()

    @pytest.mark.asyncio
    async def test_sessions_of_one_ttl_renew_in_one_commit(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        renewed = count_calls(monkeypatch, "refresh_session")
        renewals_per_commit: list[int] = []
        run_group = sqlite_metadata._Database.run_group

        def counting_run_group(db: Any, calls: list[Any]) -> Any:
            before = renewed.count
            try:
                return run_group(db, calls)
            finally:
                if renewed.count > before:
                    renewals_per_commit.append(renewed.count - before)

        monkeypatch.setattr(sqlite_metadata._Database, "run_group", counting_run_group)
        store = await self.open_store(tmp_path, self.backend_options(tmp_path, ""))
        try:
            for _ in range(3):
                await store.open_session(0.6)  # renewed every 0.2 s
            await asyncio.sleep(0.25)  # every session has renewed once since all exist
            renewals_per_commit.clear()
            await asyncio.sleep(1.0)
            assert renewals_per_commit, "no session was renewed"
            assert set(renewals_per_commit) == {3}
        finally:
            await store.close()


def read_value(path: Path, key: str) -> bytes | None:
    """Read ``key`` straight from the database file, bypassing the adapter."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        row = db.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
    return None if row is None else bytes(row[0])


class CallCount:
    count = 0


def count_calls(monkeypatch: pytest.MonkeyPatch, method: str) -> CallCount:
    """Count the calls of one of the SQL side's methods (they run on the store's thread)."""
    counted = CallCount()
    original = getattr(sqlite_metadata._Database, method)

    def counting(db: Any, *args: Any) -> Any:
        counted.count += 1
        return original(db, *args)

    monkeypatch.setattr(sqlite_metadata._Database, method, counting)
    return counted


def _op_metric(name: str, op: str) -> float:
    value = REGISTRY.get_sample_value(f"icefloe_metadata_op_{name}", {"op": op})
    return value or 0.0
