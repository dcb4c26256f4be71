"""The embedded metadata store: one SQLite database file shared by the processes of one machine.

Tables (all keys are SQLite ``TEXT`` with the default ``BINARY`` collation, which compares
UTF-8 bytes with ``memcmp``: exactly the key order the port requires):

``kv(key, value, version, session)``
    The records. ``session`` names the owning session of an ephemeral key.
``changes(id, key, kind)``
    One row per modification (put or delete). ``id`` is an ``AUTOINCREMENT`` counter, so it is
    never reused; a record's version is the id of the change that last wrote it, which makes
    versions strictly increase per key and gives watchers a commit-ordered log. Only the newest
    ``changelog_retention`` rows are kept.
``sessions(id, expires_at)``
    Live sessions with a wall-clock deadline, so that any process can judge expiry.
``meta(name, value)``
    ``pruned_through``: every change id up to this one has been pruned from ``changes``. A
    watcher whose cursor is older has missed changes and gets a ``RESET``.

Every write runs in a ``BEGIN IMMEDIATE`` transaction: it takes the database's write lock up
front, so read-check-write sequences (compare-and-set, sequenced append) from several processes
serialize instead of failing at commit. The connection lives on one worker thread per store so
that the event loop never blocks on disk or on another process's lock. Writes queue while a
group commits, and the next group takes them all in one transaction; while the store has
watchers, the group's trip to the worker thread also reads the change log after it, so the
watchers hear of every change committed so far (this process's and others') without a
second trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import sqlite3
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, ParamSpec, Self, TypeVar

from pydantic import Field

from icefloe.adapters.watch_queue import WatchQueue
from icefloe.embedded.file_writes import FileWrites
from icefloe.errors import (
    AlreadyExistsError,
    ClosedError,
    ConflictError,
    SessionExpiredError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.base import BackendOptions, OpenContext
from icefloe.ports.metadata import (
    MUST_NOT_EXIST,
    SEQUENCE_COMPONENT_WIDTH,
    Check,
    Delete,
    EventKind,
    MetadataStore,
    Put,
    Record,
    SequenceAppend,
    Session,
    Watch,
    WatchEvent,
    sequence_components,
    sequence_key,
    validate_key,
)

_log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

SCHEMA_VERSION: Final = 1
DEFAULT_FILE_NAME: Final = "metadata.db"

_CHANGE_BATCH: Final = 1000
"""Changes read per query by the watch pump; bounds the memory of one catch-up step."""
_FILE_SUFFIXES: Final = ("", "-wal", "-journal")
"""The files a commit writes: the database, and its write-ahead log or rollback journal."""
QUIET_AFTER_S: Final = 0.5
"""Once no write to the database's files has been heard of for this long, the watch pump stops
asking every ``poll_interval`` and waits for the next one. A commit is heard as its pages are
written and becomes visible once they are synced: well within this."""
IDLE_CHECK_S: Final = 1.0
"""How often a quiet watch pump asks all the same, in case a write went unheard (a filesystem
whose writes by other processes the kernel does not report)."""

_SCHEMA: Final = """
BEGIN IMMEDIATE;
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY NOT NULL,
    value BLOB NOT NULL,
    version INTEGER NOT NULL,
    session TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kv_by_session ON kv (session) WHERE session IS NOT NULL;
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    key TEXT NOT NULL,
    kind TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY NOT NULL,
    expires_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (
    name TEXT PRIMARY KEY NOT NULL,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO meta (name, value) VALUES ('pruned_through', 0);
COMMIT;
"""

_UPSERT: Final = """
INSERT INTO kv (key, value, version, session) VALUES (?, ?, ?, ?)
ON CONFLICT (key) DO UPDATE
SET value = excluded.value, version = excluded.version, session = excluded.session
"""

# ":" is the character after "9": every key of sequence p lies in [p + "-0", p + "-:"), while
# keys of a longer sequence name such as p + "-x" (also below sequence_upper_bound(p)) do not.
_SEQUENCE_LOW: Final = "-0"
_SEQUENCE_HIGH: Final = "-:"
_MAX_COMPONENT: Final = 10**SEQUENCE_COMPONENT_WIDTH - 1


class SqliteMetadataOptions(BackendOptions):
    """Options of the ``sqlite`` metadata backend (section ``[metadata]``)."""

    path: str | None = Field(
        default=None,
        description="Database file; default <data_dir>/metadata.db. Parent folders are created.",
    )
    poll_interval: float = Field(
        default=0.01,
        gt=0,
        description="Seconds between checks for changes committed by other processes.",
    )
    listen_for_writes: bool = Field(
        default=True,
        description=(
            "On Linux, hear of writes to the database's files from the kernel (inotify) and "
            "check every poll_interval only while they come, about once a second at rest; "
            "false checks every poll_interval all the time."
        ),
    )
    changelog_retention: int = Field(
        default=100_000,
        ge=1,
        description="Newest changes kept for watchers; a watcher further behind gets RESET.",
    )
    reap_interval: float = Field(
        default=0.25,
        gt=0,
        description="Seconds between sweeps that delete expired sessions and their keys.",
    )
    watch_queue_size: int = Field(
        default=10_000,
        ge=1,
        description="Events buffered per watcher; on overflow the watcher gets RESET.",
    )
    busy_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds to wait for another process's write lock before UnavailableError.",
    )


# --- the SQL side: runs on the store's worker thread only ----------------------------------


@dataclass(frozen=True, slots=True)
class _Change:
    id: int
    key: str
    kind: EventKind


@dataclass(frozen=True, slots=True)
class _ChangeBatch:
    """Changes with ids after ``after``, read in one snapshot with the log's bounds."""

    after: int
    changes: list[_Change]
    pruned_through: int
    head: int


class _Database:
    """The store's SQL; every method runs on the store's single worker thread."""

    def __init__(self, path: Path, options: SqliteMetadataOptions) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._retention = options.changelog_retention
        self._pruned_through = 0  # a cache: only used to skip pruning that is not due
        self._in_group = False  # inside run_group: writes take savepoints, not transactions
        # isolation_level=None: the sqlite3 module issues no implicit BEGIN; we do it ourselves.
        self._conn = sqlite3.connect(path, isolation_level=None)
        try:
            self._configure_patiently(options)
        except BaseException:
            self._conn.close()
            raise

    def _configure_patiently(self, options: SqliteMetadataOptions) -> None:
        # Connections opening a new file together can deadlock on its locks while it is still
        # in rollback-journal mode; SQLite then answers BUSY at once instead of calling the busy
        # handler, so we wait out the other side ourselves, within the same busy_timeout.
        deadline = time.monotonic() + options.busy_timeout
        while True:
            try:
                self._configure(options)
                return
            except sqlite3.OperationalError as exc:
                busy = (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() >= deadline:
                    raise
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                time.sleep(0.01)

    def _configure(self, options: SqliteMetadataOptions) -> None:
        # The busy timeout first: switching to WAL and creating tables take locks too.
        self._conn.execute(f"PRAGMA busy_timeout = {int(options.busy_timeout * 1000)}")
        (mode,) = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()
        if mode != "wal":
            _log.warning("SQLite refused WAL mode (got %r); concurrent readers will block", mode)
        # An acknowledged write must survive a power cut, not only a process crash.
        self._conn.execute("PRAGMA synchronous = FULL")
        (version,) = self._conn.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"the metadata database was written by a newer Icefloe (schema {version}, "
                f"this one reads {SCHEMA_VERSION}); upgrade icefloe"
            )
        if version < SCHEMA_VERSION:
            self._conn.executescript(_SCHEMA)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        self._conn.close()

    # --- transactions and the change log ----------------------------------------------------

    def run_group_and_read_changes(
        self, calls: list[Callable[[], Any]], after: int
    ) -> tuple[list[tuple[bool, Any]], _ChangeBatch | None]:
        """:meth:`run_group`, then the changes after ``after`` (:meth:`read_changes`), in one
        trip to this thread. ``None`` for the changes if reading them failed: the group's
        outcomes stand, and the watch pump reads them later."""
        outcomes = self.run_group(calls)
        try:
            return outcomes, self.read_changes(after, _CHANGE_BATCH)
        except sqlite3.Error as exc:
            _log.warning("reading the changes after a group commit: %s", exc)
            return outcomes, None

    def run_group(self, calls: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
        """Run write ``calls`` in one transaction: one commit (one fsync) for them all.

        Each call runs in its own savepoint, so a call that fails (a version conflict) leaves
        the others' writes in place. Returns (succeeded, result or exception) per call.
        """
        outcomes: list[tuple[bool, Any]] = []
        self._conn.execute("BEGIN IMMEDIATE")
        self._in_group = True
        try:
            for call in calls:
                try:
                    outcomes.append((True, call()))
                except Exception as exc:  # noqa: BLE001 - handed to the call's own caller
                    outcomes.append((False, exc))
                if not self._conn.in_transaction:
                    # SQLite rolled the whole transaction back (a full disk, an I/O error):
                    # the writes before this one are gone too.
                    succeeded, failure = outcomes[-1]
                    if succeeded:
                        raise StorageError("the metadata transaction was rolled back")
                    raise failure
            self._prune()
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            self._in_group = False
        return outcomes

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        if self._in_group:
            yield from self._in_savepoint()
            return
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._prune()
            self._conn.execute("COMMIT")
        except BaseException:
            # SQLite rolls some failures back by itself; a second ROLLBACK would then fail.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    def _in_savepoint(self) -> Iterator[None]:
        self._conn.execute("SAVEPOINT one_write")
        try:
            yield
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK TO one_write")
                self._conn.execute("RELEASE one_write")
            raise
        self._conn.execute("RELEASE one_write")

    def _record_change(self, key: str, kind: EventKind) -> int:
        cursor = self._conn.execute(
            "INSERT INTO changes (key, kind) VALUES (?, ?)", (key, kind.value)
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def _head(self) -> int:
        row = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'changes'")
        found = row.fetchone()
        return int(found[0]) if found else 0

    def _prune(self) -> None:
        threshold = self._head() - self._retention
        if threshold <= self._pruned_through:
            return
        self._conn.execute("DELETE FROM changes WHERE id <= ?", (threshold,))
        self._conn.execute(
            "UPDATE meta SET value = MAX(value, ?) WHERE name = 'pruned_through'", (threshold,)
        )
        self._pruned_through = threshold

    def _version(self, key: str) -> int | None:
        row = self._conn.execute("SELECT version FROM kv WHERE key = ?", (key,)).fetchone()
        return int(row[0]) if row else None

    def _check(self, key: str, expected: int | None) -> None:
        if expected is None:
            return
        current = self._version(key)
        if expected == MUST_NOT_EXIST:
            if current is not None:
                raise AlreadyExistsError(f"{key!r} already exists (version {current})")
        elif current != expected:
            found = "does not exist" if current is None else f"has version {current}"
            raise ConflictError(f"{key!r} {found}, expected version {expected}")

    def _write_key(self, key: str, value: bytes, session_id: str | None) -> int:
        version = self._record_change(key, EventKind.PUT)
        self._conn.execute(_UPSERT, (key, value, version, session_id))
        return version

    def _delete_key(self, key: str) -> bool:
        if self._version(key) is None:
            return False
        self._record_change(key, EventKind.DELETE)
        self._conn.execute("DELETE FROM kv WHERE key = ?", (key,))
        return True

    def _delete_session_keys(self, session_id: str) -> None:
        self._conn.execute(
            "INSERT INTO changes (key, kind) SELECT key, ? FROM kv WHERE session = ? ORDER BY key",
            (EventKind.DELETE.value, session_id),
        )
        self._conn.execute("DELETE FROM kv WHERE session = ?", (session_id,))

    def _check_session(self, session_id: str) -> None:
        row = self._conn.execute(
            "SELECT expires_at FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None or row[0] <= time.time():
            raise SessionExpiredError(
                f"session {session_id} has expired; its ephemeral keys are gone: open a new session"
            )

    # --- reads ------------------------------------------------------------------------------

    def get(self, key: str) -> Record | None:
        row = self._conn.execute("SELECT key, value, version FROM kv WHERE key = ?", (key,))
        return _record(row.fetchone())

    def scan(self, start: str, end: str, limit: int | None) -> list[Record]:
        rows = self._conn.execute(
            "SELECT key, value, version FROM kv WHERE key >= ? AND key < ? ORDER BY key LIMIT ?",
            (start, end, -1 if limit is None else limit),
        )
        return [Record(key, value, version) for key, value, version in rows]

    def floor(self, key: str) -> Record | None:
        row = self._conn.execute(
            "SELECT key, value, version FROM kv WHERE key <= ? ORDER BY key DESC LIMIT 1", (key,)
        )
        return _record(row.fetchone())

    def ceiling(self, key: str) -> Record | None:
        row = self._conn.execute(
            "SELECT key, value, version FROM kv WHERE key >= ? ORDER BY key LIMIT 1", (key,)
        )
        return _record(row.fetchone())

    def head(self) -> int:
        return self._head()

    def data_version(self) -> int:
        # Changes whenever *another* connection commits; our own commits leave it alone.
        (version,) = self._conn.execute("PRAGMA data_version").fetchone()
        return int(version)

    def read_changes(self, after: int, limit: int) -> _ChangeBatch:
        # One read transaction, so the pruning mark and the rows are from the same snapshot:
        # read separately, a prune in between could remove rows we then never see.
        self._conn.execute("BEGIN")
        try:
            (pruned_through,) = self._conn.execute(
                "SELECT value FROM meta WHERE name = 'pruned_through'"
            ).fetchone()
            rows = self._conn.execute(
                "SELECT id, key, kind FROM changes WHERE id > ? ORDER BY id LIMIT ?",
                (after, limit),
            ).fetchall()
            head = self._head()
        finally:
            self._conn.execute("COMMIT")
        changes = [_Change(id_, key, EventKind(kind)) for id_, key, kind in rows]
        return _ChangeBatch(after, changes, int(pruned_through), head)

    # --- writes -----------------------------------------------------------------------------

    def put(self, key: str, value: bytes, expected: int | None, session_id: str | None) -> int:
        with self._writing():
            self._check(key, expected)
            if session_id is not None:
                self._check_session(session_id)
            return self._write_key(key, value, session_id)

    def delete(self, key: str, expected: int | None) -> bool:
        with self._writing():
            self._check(key, expected)
            return self._delete_key(key)

    def delete_range(self, start: str, end: str) -> None:
        with self._writing():
            self._conn.execute(
                "INSERT INTO changes (key, kind) "
                "SELECT key, ? FROM kv WHERE key >= ? AND key < ? ORDER BY key",
                (EventKind.DELETE.value, start, end),
            )
            self._conn.execute("DELETE FROM kv WHERE key >= ? AND key < ?", (start, end))

    def append_sequence(self, prefix: str, value: bytes, deltas: tuple[int, ...]) -> Record:
        with self._writing():
            last = self._conn.execute(
                "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key DESC LIMIT 1",
                (prefix + _SEQUENCE_LOW, prefix + _SEQUENCE_HIGH),
            ).fetchone()
            previous = _previous_components(prefix, last[0], len(deltas)) if last else None
            components = tuple(
                (0 if previous is None else previous[i]) + delta for i, delta in enumerate(deltas)
            )
            if max(components) > _MAX_COMPONENT:
                raise ValueError(f"sequence {prefix!r} would pass {_MAX_COMPONENT}")
            key = sequence_key(prefix, components)
            validate_key(key)
            return Record(key, value, self._write_key(key, value, None))

    def transact(self, checks: list[Check], writes: list[Put | Delete]) -> None:
        with self._writing():
            for check in checks:
                self._check(check.key, check.version)
            for write in writes:
                if isinstance(write, Put):
                    self._write_key(write.key, write.value, None)
                else:
                    self._delete_key(write.key)

    # --- sessions ---------------------------------------------------------------------------

    def create_session(self, session_id: str, ttl: float) -> None:
        with self._writing():
            self._conn.execute(
                "INSERT INTO sessions (id, expires_at) VALUES (?, ?)",
                (session_id, time.time() + ttl),
            )

    def refresh_session(self, session_id: str, ttl: float) -> bool:
        """Push the deadline back; ``False`` if the session is gone or already expired."""
        now = time.time()
        with self._writing():
            # An expired session stays dead even if no reaper has deleted it yet: another
            # process may already have acted on its expiry.
            updated = self._conn.execute(
                "UPDATE sessions SET expires_at = ? WHERE id = ? AND expires_at > ?",
                (now + ttl, session_id, now),
            )
            return updated.rowcount == 1

    def end_session(self, session_id: str) -> None:
        with self._writing():
            self._delete_session_keys(session_id)
            self._conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def reap(self) -> list[str]:
        """Delete expired sessions and their keys; return the reaped session ids."""
        # A plain read first: most sweeps find nothing, and must not take the write lock.
        if not self._expired_sessions():
            return []
        with self._writing():
            expired = self._expired_sessions()  # again: another process may have reaped
            for session_id in expired:
                self._delete_session_keys(session_id)
                self._conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            return expired

    def _expired_sessions(self) -> list[str]:
        rows = self._conn.execute("SELECT id FROM sessions WHERE expires_at <= ?", (time.time(),))
        return [session_id for (session_id,) in rows]


def _record(row: tuple[str, bytes, int] | None) -> Record | None:
    return None if row is None else Record(row[0], row[1], row[2])


def _previous_components(prefix: str, key: str, count: int) -> tuple[int, ...]:
    try:
        components = sequence_components(prefix, key)
    except ValueError as exc:
        raise StorageError(
            f"{key!r} lies in sequence {prefix!r} but is not a sequence key"
        ) from exc
    if len(components) != count:
        raise ValueError(
            f"sequence {prefix!r} has {len(components)} components, got {count} deltas"
        )
    return components


def _translated(path: Path, fn: Callable[[], _T]) -> _T:
    """Run ``fn``, turning sqlite3 and file-system errors into :mod:`icefloe.errors` types."""
    try:
        return fn()
    except OSError as exc:  # creating the folder of the database file
        raise StorageError(f"metadata database {path}: {exc}") from exc
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
        if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise UnavailableError(
                f"metadata database {path} stayed locked by another connection longer than "
                f"busy_timeout ({exc}); retry, or raise [metadata] busy_timeout"
            ) from exc
        if code == sqlite3.SQLITE_FULL:
            # The write was rolled back whole: once space is freed, the same write succeeds.
            raise UnavailableError(
                f"metadata database {path}: the disk is full ({exc}); free space on it"
            ) from exc
        raise StorageError(f"metadata database {path}: {exc}") from exc


# --- the async side ------------------------------------------------------------------------


class _SqliteWatch(Watch):
    """A watcher fed by its store's pump; holds at most ``limit`` undelivered events."""

    def __init__(self, store: SqliteMetadataStore, prefix: str, cursor: int, limit: int) -> None:
        self.prefix = prefix
        self.cursor = cursor
        """Id of the last change this watcher has accounted for (delivered, skipped or reset)."""
        self._store = store
        self._queue = WatchQueue(limit)

    def take(self, batch: _ChangeBatch) -> None:
        """Queue the events of ``batch`` that this watcher has not seen yet."""
        # A batch read from beyond our cursor (we registered while it was in flight) would
        # leave a hole; the pump reads again from our cursor on its next round.
        if self._queue.closed or batch.after > self.cursor:
            return
        if batch.pruned_through > self.cursor:
            self._queue.reset()
            self._skip_to(batch.head)
            return
        for change in batch.changes:
            if change.id <= self.cursor or not change.key.startswith(self.prefix):
                continue
            if not self._queue.put(WatchEvent(change.kind, change.key, change.id)):
                self._skip_to(batch.head)  # the queue overflowed into a RESET
                return
        if batch.changes:
            self.cursor = max(self.cursor, batch.changes[-1].id)

    def _skip_to(self, head: int) -> None:
        # A RESET is queued: the re-read it asks for sees every change up to ``head``.
        self.cursor = max(self.cursor, head)

    def stop(self) -> None:
        """End the watch: ``next_event`` returns ``None`` from now on."""
        self._queue.close()

    async def next_event(self) -> WatchEvent | None:
        return await self._queue.get()

    async def close(self) -> None:
        self.stop()
        self._store._forget_watch(self)


class _SqliteSession(Session):
    """A row in ``sessions``, kept alive by its store's heartbeat task."""

    def __init__(
        self, store: SqliteMetadataStore, session_id: str, ttl: float, created_at: float
    ) -> None:
        """``created_at``: when the row was asked for (its deadline counts from later)."""
        self.id = session_id
        self.ttl = ttl
        self._store = store
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.renewed_at = created_at

    @property
    def lost(self) -> asyncio.Future[None]:
        return self._lost

    def expire(self) -> None:
        if not self._lost.done():
            self._lost.set_result(None)

    async def close(self) -> None:
        await self._store._end_session(self)


class SqliteMetadataStore(MetadataStore):
    """The embedded metadata store: a SQLite database file, no server.

    Several processes may open the same file: writes serialize on SQLite's write lock, and each
    store asks for the others' changes every ``poll_interval`` to feed its watchers (on Linux
    only while writes to the file are heard of, see :mod:`icefloe.embedded.file_writes`).
    """

    capabilities = frozenset({MetadataStore.MULTI_KEY_TRANSACTION})
    options_model = SqliteMetadataOptions

    def __init__(
        self,
        path: Path,
        options: SqliteMetadataOptions,
        executor: ThreadPoolExecutor,
        db: _Database,
    ) -> None:
        """Use :meth:`open`, which connects on the worker thread first."""
        self._path = path
        self._options = options
        self._executor = executor
        self._db = db
        self._closed = False
        self._released = False  # the connection is closed and the worker thread stopped
        self._watchers: set[_SqliteWatch] = set()
        self._sessions: dict[str, _SqliteSession] = {}
        self._heartbeats: dict[str, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        """Set after a local change the watchers were not handed at once, and after a watcher
        registers; wakes the watch pump."""
        self._delivered_at = -math.inf
        """When a group commit last handed the watchers every change (the loop's clock)."""
        self._heard = asyncio.Event()
        """Set when a write to the database's files is heard of; wakes a quiet watch pump."""
        self._file_writes = (
            FileWrites.watch(
                path.parent, [path.name + suffix for suffix in _FILE_SUFFIXES], self._heard.set
            )
            if options.listen_for_writes
            else None
        )
        self._queued: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        """Writes waiting for the next group commit."""
        self._committer: asyncio.Task[None] | None = None
        self._pump: asyncio.Task[None] | None = None
        self._spawn(self._reap_forever(), "reaper")

    @classmethod
    async def open(cls, options: SqliteMetadataOptions, context: OpenContext) -> Self:
        """Open (creating if needed) the database file and start the session reaper.

        Args:
            options: The validated options.
            context: ``data_dir`` holds the database unless ``options.path`` is set;
                ``watch_delay_s`` lengthens ``poll_interval`` for this process.

        Raises:
            StorageError: the file cannot be opened or is not an Icefloe metadata database.
            UnavailableError: another process held the database locked for too long.
        """
        path = Path(options.path) if options.path else context.data_dir / DEFAULT_FILE_NAME
        if context.watch_delay_s > options.poll_interval:
            # Each poll reads the change log: a process that can wait polls less often.
            options = options.model_copy(update={"poll_interval": context.watch_delay_s})
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="icefloe-sqlite")
        loop = asyncio.get_running_loop()
        try:
            db = await loop.run_in_executor(
                executor, _translated, path, functools.partial(_Database, path, options)
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(path, options, executor, db)

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # --- running SQL on the worker thread ---------------------------------------------------

    async def _submit(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        # Internal callers (close, heartbeats) use this directly: they run while closing.
        if self._released:
            raise ClosedError(f"metadata store {self._path} is closed")
        call = functools.partial(fn, *args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, _translated, self._path, call)

    async def _read(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        self._check_open()
        return await self._submit(fn, *args, **kwargs)

    async def _write(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await self._queue_write(fn, *args, **kwargs)

    def _queue_write(
        self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> asyncio.Future[_T]:
        """Queue a write for the next group commit; its outcome comes through the future."""
        # Writes queue while a group commits, and the next group takes them all: under load
        # many writes share one fsync, and an idle store still commits a write at once.
        self._check_open()
        call = functools.partial(_translated, self._path, functools.partial(fn, *args, **kwargs))
        done: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        self._queued.append((call, done))
        if self._committer is None:
            self._committer = self._spawn(self._commit_queued(), "group-commit")
        return done

    async def _commit_queued(self) -> None:
        group: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        try:
            while self._queued:
                group, self._queued = self._queued, []
                calls = [c for c, _ in group]
                changes = None
                try:
                    if self._watchers:
                        # The watchers' changes come back with the commit: no second trip to
                        # the worker thread, and no wake-up of the pump, per group.
                        after = min(watch.cursor for watch in self._watchers)
                        outcomes, changes = await self._submit(
                            self._db.run_group_and_read_changes, calls, after
                        )
                    else:
                        outcomes = await self._submit(self._db.run_group, calls)
                except Exception as exc:  # noqa: BLE001 - every write of the group hears of it
                    outcomes = [(False, exc)] * len(group)
                for (_, done), (succeeded, value) in zip(group, outcomes, strict=True):
                    if done.done():
                        continue
                    if succeeded:
                        done.set_result(value)
                    else:
                        done.set_exception(value)
                self._feed(changes)  # once the writers have heard of their writes
        finally:
            self._committer = None
            for _, done in [*group, *self._queued]:
                if not done.done():  # cancelled: no write may wait forever
                    done.set_exception(ClosedError(f"metadata store {self._path} is closed"))

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"metadata store {self._path} is closed; open a new one")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"icefloe-sqlite-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error(
                "background task %s of %s failed",
                task.get_name(),
                self._path,
                exc_info=task.exception(),
            )

    # --- key-value primitives ---------------------------------------------------------------

    async def _get(self, key: str) -> Record | None:
        return await self._read(self._db.get, key)

    async def _put(
        self, key: str, value: bytes, expected_version: int | None, session: Session | None
    ) -> Record:
        if session is None:
            version = await self._write(self._db.put, key, value, expected_version, None)
            return Record(key, value, version)
        owned = self._own(session)
        if not owned.alive:
            raise SessionExpiredError(f"session {owned.id} is closed or expired; open a new one")
        try:
            version = await self._write(self._db.put, key, value, expected_version, owned.id)
        except SessionExpiredError:
            owned.expire()
            raise
        return Record(key, value, version)

    async def _delete(self, key: str, expected_version: int | None) -> bool:
        return await self._write(self._db.delete, key, expected_version)

    async def _delete_range(self, start: str, end: str) -> None:
        await self._write(self._db.delete_range, start, end)

    async def _scan(self, start: str, end: str, limit: int | None) -> list[Record]:
        return await self._read(self._db.scan, start, end, limit)

    async def _floor(self, key: str) -> Record | None:
        return await self._read(self._db.floor, key)

    async def _ceiling(self, key: str) -> Record | None:
        return await self._read(self._db.ceiling, key)

    async def _append_sequence(self, prefix: str, value: bytes, deltas: tuple[int, ...]) -> Record:
        return await self._write(self._db.append_sequence, prefix, value, deltas)

    async def _append_sequences(
        self, appends: list[SequenceAppend]
    ) -> list[Record | BaseException]:
        # Queued together, so they go in one group commit, each in its own savepoint.
        pending = [
            self._queue_write(self._db.append_sequence, a.prefix, a.value, a.deltas)
            for a in appends
        ]
        if not pending:
            return []
        try:
            await asyncio.wait(pending)
        except asyncio.CancelledError:
            for write in pending:  # as awaiting one write alone would: nobody waits for them
                write.cancel()
            raise
        return [write.exception() or write.result() for write in pending]

    async def _transact(self, checks: list[Check], writes: list[Put | Delete]) -> None:
        await self._write(self._db.transact, checks, writes)

    # --- notifications ----------------------------------------------------------------------

    async def _watch(self, prefix: str) -> Watch:
        # Every change with a larger id commits after this read: that is the contract's
        # "established when watch() returns".
        head = await self._read(self._db.head)
        self._check_open()  # close() may have run meanwhile and would never end this watch
        watch = _SqliteWatch(self, prefix, head, self._options.watch_queue_size)
        self._watchers.add(watch)
        if self._pump is None:
            self._pump = self._spawn(self._pump_forever(), "watch-pump")
        self._changed.set()
        return watch

    def _forget_watch(self, watch: _SqliteWatch) -> None:
        self._watchers.discard(watch)

    async def _pump_forever(self) -> None:
        """Feed the watchers what group commits did not hand them: other processes' changes
        by polling, and whatever a commit could not read."""
        seen_version = -1  # data_version is never negative: the first poll always reads
        while True:
            if not self._watchers:
                self._changed.clear()
                await self._changed.wait()
                continue
            local = await self._wait_for_change()
            try:
                if not local:
                    # Read data_version *before* the changes: a commit landing in between is
                    # then seen again next round rather than missed.
                    version = await self._submit(self._db.data_version)
                    if version == seen_version:
                        continue
                    seen_version = version
                await self._deliver()
            except ClosedError:
                return
            except StorageError as exc:
                # Cursors did not move, so nothing is lost: the next round retries.
                _log.warning("watch pump of %s: %s", self._path, exc)

    async def _wait_for_change(self) -> bool:
        """Wait for a local change, or until it is time to ask about other processes' changes:
        after ``poll_interval`` while writes to the database are heard of (or cannot be), at
        the next write heard (or :data:`IDLE_CHECK_S`) once they have stopped. ``True`` if a
        local change woke us."""
        writes = self._file_writes
        if writes is not None and writes.quiet_for(QUIET_AFTER_S):
            self._heard.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._changed, self._heard)]
            try:
                await asyncio.wait(waits, timeout=IDLE_CHECK_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        else:
            await self._until_poll_due()
        woken = self._changed.is_set()
        self._changed.clear()
        return woken

    async def _until_poll_due(self) -> None:
        """Until the pump is woken (``_changed``), or a poll interval from now; later while
        group commits keep handing the watchers every change (their reads bring other
        processes' changes too): until an interval has passed since the last of them."""
        loop = asyncio.get_running_loop()
        interval = self._options.poll_interval
        due = loop.time() + interval
        while not self._changed.is_set():
            remaining = max(due, self._delivered_at + interval) - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()

    def _feed(self, changes: _ChangeBatch | None) -> None:
        """Hand ``changes``, read right after a local commit, to the watchers; the pump reads
        what it did not bring them (all of it, when nothing was read)."""
        if changes is not None:
            for watch in list(self._watchers):
                watch.take(changes)
            if all(watch.cursor >= changes.head for watch in self._watchers):
                # Every change, this process's and others', up to now is delivered: the pump
                # need not ask about other processes' for another poll interval.
                self._delivered_at = asyncio.get_running_loop().time()
                return
        self._changed.set()

    async def _deliver(self) -> None:
        while self._watchers:
            after = min(watch.cursor for watch in self._watchers)
            batch = await self._submit(self._db.read_changes, after, _CHANGE_BATCH)
            for watch in list(self._watchers):
                watch.take(batch)
            if len(batch.changes) < _CHANGE_BATCH:
                return

    # --- sessions ---------------------------------------------------------------------------

    async def _open_session(self, ttl: float) -> Session:
        session_id = uuid.uuid4().hex
        asked = time.monotonic()
        await self._write(self._db.create_session, session_id, ttl)
        # If close() ran meanwhile, nobody would end this session: let the reapers expire it.
        self._check_open()
        session = _SqliteSession(self, session_id, ttl, asked)
        self._sessions[session_id] = session
        self._heartbeats[session_id] = self._spawn(
            self._heartbeat_forever(session), f"heartbeat-{session_id[:8]}"
        )
        return session

    def _own(self, session: Session) -> _SqliteSession:
        if not isinstance(session, _SqliteSession) or session._store is not self:
            raise ValueError(f"session {session.id} was not opened by this metadata store")
        return session

    async def _heartbeat_forever(self, session: _SqliteSession) -> None:
        # A third of the ttl apart, on a clock shared by the store's sessions: those of one TTL
        # renew at the same moment, and so in one group commit, rather than each with its own
        # write. Each renewal is due a third after the one before was, however long that one
        # took, so a leader's last third has one write to wait for, not two round trips; more
        # often would wake every process's watch more often (docs/performance.md).
        period = session.ttl / 3
        while session.alive:
            await asyncio.sleep(
                max(0.0, min(period - time.monotonic() % period, session.remaining()))
            )
            sent = time.monotonic()
            try:
                async with asyncio.timeout(max(0.0, session.remaining())):
                    alive = await self._write(self._db.refresh_session, session.id, session.ttl)
            except ClosedError:
                return
            except (StorageError, TimeoutError) as exc:
                # Keep trying until the deadline: past it, another process may have reaped the
                # session (a database locked that long, or this process stopped).
                if session.remaining() <= 0:
                    _log.warning("session %s: no heartbeat for its ttl (%r)", session.id, exc)
                    session.expire()
                    return
                _log.warning("heartbeat of session %s failed: %s", session.id, exc)
                continue
            if not alive:
                _log.warning("session %s expired before its heartbeat could renew it", session.id)
                session.expire()
            else:
                session.renewed_at = sent

    async def _end_session(self, session: _SqliteSession) -> None:
        if session.closed:
            return
        session.closed = True
        heartbeat = self._heartbeats.pop(session.id, None)
        if heartbeat is not None:
            heartbeat.cancel()
        try:
            await self._submit(self._db.end_session, session.id)
            self._changed.set()
        finally:
            # Even if the delete failed, the keys go when the reaper sees the lapsed deadline.
            self._sessions.pop(session.id, None)
            session.expire()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self._options.reap_interval)
            try:
                reaped = await self._submit(self._db.reap)
            except ClosedError:
                return
            except StorageError as exc:
                _log.warning("session reaper of %s: %s", self._path, exc)
                continue
            if reaped:
                self._changed.set()
            for session_id in reaped:
                session = self._sessions.get(session_id)
                if session is not None:
                    session.expire()

    # --- lifecycle --------------------------------------------------------------------------

    async def close(self) -> None:
        """Stop background work, end sessions (deleting their keys), close watchers and the file.

        Idempotent. Further calls on the store raise :class:`~icefloe.errors.ClosedError`.
        """
        if self._closed:
            return
        self._closed = True
        if self._committer is not None:
            # Writes accepted before close are committed; no new ones can queue now.
            await asyncio.gather(self._committer, return_exceptions=True)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for session in list(self._sessions.values()):
            try:
                await self._end_session(session)
            except StorageError as exc:
                _log.warning("could not end session %s on close: %s", session.id, exc)
        for watch in list(self._watchers):
            watch.stop()
        self._watchers.clear()
        if self._file_writes is not None:
            self._file_writes.close()
        try:
            await self._submit(self._db.close)
        finally:
            self._released = True
            self._executor.shutdown(wait=False)
