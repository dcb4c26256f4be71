"""The local object store: objects as files under a root folder.

The object ``a/b/c`` is the file ``<root>/a/b/c``. Every write first goes to a temporary file
in a hidden sibling folder, ``<root's parent>/.<root's name>.icefloe-tmp``: outside the root, so
that no key can ever name a temporary file and ``list`` never sees one, yet on the same
filesystem, so that the finished file can be moved or linked into place atomically:

- a plain put ``os.replace``-s the temporary file onto the key: readers see the old object or
  the new one, never a mix;
- a create-if-absent put ``os.link``-s it to the key. ``link`` fails if the name exists, so
  exactly one of any number of racing writers wins, across threads and processes alike.

The data is fsync-ed before the commit and the folder after it, so a returned put survives a
crash. A writer that dies mid-write leaves only a temporary file, removed by a later ``open``
(as is the empty one each store keeps ready for its next put, see :class:`_SpareTempFile`).

Blocking file I/O runs on a bounded thread pool (``io_threads``). One exception: a ranged
read for ``get_view`` (how WAL chunks are read for fetches) first copies what the page cache
holds on the event loop, with ``RWF_NOWAIT`` so that it never waits for the disk; only a range
not cached goes to the pool. A handoff to a thread and back costs more than copying a
megabyte, and both threads want the GIL the moment the other lets it go.

Known limit of a filesystem: a key cannot also be a folder of other keys (``a`` and ``a/b``
cannot both exist); such a write fails with :class:`~icefloe.errors.StorageError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import stat
import threading
import time
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO, Final, Self, TypeVar, TypeVarTuple, Unpack

from pydantic import Field

from icefloe.adapters.blocking import BlockingSdk
from icefloe.embedded.file_io import (
    NOWAIT,
    READ_FROM_CACHE_AT_ONCE,
    file_error,
    fsync_folder,
    uninitialised_buffer,
)
from icefloe.errors import (
    AlreadyExistsError,
    ClosedError,
    ConfigError,
    NotFoundError,
    StorageError,
)
from icefloe.ports.base import BackendOptions, OpenContext
from icefloe.ports.object_store import ObjectInfo, ObjectStore, RequestKind

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

TEMP_FOLDER_SUFFIX: Final = ".icefloe-tmp"
STALE_TEMP_SECONDS: Final = 24 * 3600
"""A temporary file untouched this long belongs to a dead writer (live ones write or commit)."""
SPARE_MAX_AGE_S: Final = 3600.0
"""A temporary file made ahead of a put is used within this long, or replaced."""
SPARE_DELAY_S: Final = 0.003
"""How long after a put its successor's temporary file is made: a file created while the
caller's next step fsyncs (a WAL put is followed by the index commit) joins that fsync's
journal commit and slows it; a few milliseconds later the filesystem is idle again."""

WRITE_BACK_BYTES: Final = 4 << 20
"""A large object is made durable this many bytes at a time as it is written, not all at its
end. Where the filesystem's journal writes data before the metadata that names it (ext4), the
fsync of a file of hundreds of megabytes (a compacted data file) holds up every small fsync
behind it, the WAL puts that acknowledge produce requests among them, for as long as the disk
takes to write it all: at most a few megabytes stand in their way instead."""

_COMMIT_ATTEMPTS: Final = 64
_LIST_PAGE: Final = 1000


class LocalObjectStoreOptions(BackendOptions):
    """Options of ``[object_store] backend = "local"``."""

    root: str | None = None
    """Folder holding the objects; default ``<data dir>/objects``."""
    io_threads: int = Field(default=8, ge=1, le=256)
    """Size of the thread pool that runs the blocking file I/O."""


class LocalObjectStore(ObjectStore):
    """Objects as files under a root folder; see the module docstring."""

    capabilities = frozenset({ObjectStore.SHARED})
    options_model = LocalObjectStoreOptions
    billed_per_request = False

    def __init__(self, root: Path, io_threads: int = 8) -> None:
        """Use an existing root folder; :meth:`open` is the usual way in.

        Args:
            root: Absolute, normalised folder holding the objects; it and :attr:`temp_dir`
                must exist on the same filesystem.
            io_threads: Size of the thread pool for blocking file I/O.
        """
        super().__init__()
        self.root = root
        self.temp_dir = temp_folder_of(root)
        self._root = str(root)
        self._temp = str(self.temp_dir)
        self._files = BlockingSdk(
            f"the local object store at {self._root!r}",
            threads=io_threads,
            thread_name_prefix="icefloe-local-store",
            translate=self._translate,
            sdk_types=(OSError,),
        )
        self._spare = _SpareTempFile(self._temp)
        self._making_spare: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, options: LocalObjectStoreOptions, context: OpenContext) -> Self:
        """Create the folders if needed, clear stale temporary files, and open the store.

        Raises:
            ConfigError: the root cannot hold a store (the filesystem root, or a mount point
                whose parent is another filesystem).
            StorageError: the folders cannot be created or read.
        """
        root = _absolute(Path(options.root or context.data_dir / "objects"))
        if not root.name:
            raise ConfigError(
                f"[object_store] root = {str(root)!r}: choose a folder, not a filesystem root"
            )
        try:
            await asyncio.to_thread(_prepare_folders, root, temp_folder_of(root))
        except OSError as exc:
            raise StorageError(f"[object_store] root = {str(root)!r} is not usable: {exc}") from exc
        return cls(root, options.io_threads)

    async def close(self) -> None:
        """Refuse new file operations, then wait for the running ones."""
        await self._files.close()
        if self._making_spare is not None:
            await self._making_spare
        self._spare.discard()

    # --- primitives ------------------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes | bytearray | memoryview, if_absent: bool
    ) -> ObjectInfo:
        self._check_open()
        self.stats.record(RequestKind.PUT, memoryview(data).nbytes)
        try:
            return await self._run(self._put_file, key, data, if_absent)
        finally:
            self._make_spare()

    async def _put_stream(
        self, key: str, chunks: AsyncIterable[bytes | bytearray | memoryview], if_absent: bool
    ) -> ObjectInfo:
        self._check_open()
        self.stats.record(RequestKind.PUT)
        final = self._path_of(key)
        temp = await self._run(_TempFile, self._temp)
        try:
            # Exceptions raised by ``chunks`` itself are the caller's and propagate unchanged.
            async for chunk in chunks:
                await self._run(temp.write, chunk)
                self.stats.record(RequestKind.PUT, memoryview(chunk).nbytes, requests=0)
            info = await self._run(temp.seal, key)
            await self._run(self._commit, temp.path, key, final, if_absent)
            return info
        finally:
            await self._discard(temp)

    async def _get(self, key: str, start: int, end: int | None) -> bytes:
        self._check_open()
        data = b""
        try:
            data = await self._run(self._read_range, key, start, end)
            return data
        finally:
            self.stats.record(RequestKind.GET, len(data))

    async def _get_view(self, key: str, start: int, end: int | None) -> memoryview:
        self._check_open()
        filled = 0
        try:
            cached, filled = self._read_cached(key, start, end) or (None, 0)
            if cached is not None and filled == len(cached):
                return cached
            read, filled = await self._run(self._read_into, key, start, end, cached, filled)
            return read[:filled]
        finally:
            self.stats.record(RequestKind.GET, filled)

    def _read_cached(self, key: str, start: int, end: int | None) -> tuple[memoryview, int] | None:
        """The range in a new buffer, filled from its start as far as the page cache holds it
        (on the event loop, never waiting for the disk); ``None`` if the pool must read it
        all: too large, nothing cached, or any error (which the pool's read then reports)."""
        if NOWAIT is None or end is None or end - start > READ_FROM_CACHE_AT_ONCE:
            return None
        try:
            fd = os.open(self._path_of(key), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            buffer = _buffer_for(fd, start, end)
            if not len(buffer):
                return buffer, 0
            return buffer, os.preadv(fd, [buffer], start, NOWAIT)
        except OSError:  # EAGAIN: not in the page cache
            return None
        finally:
            os.close(fd)

    def _read_into(
        self, key: str, start: int, end: int | None, buffer: memoryview | None, filled: int
    ) -> tuple[memoryview, int]:
        """Read the range into ``buffer`` (a new one if ``None``) from ``filled`` on; the
        buffer and how much of it holds the object's bytes (less at the object's end)."""
        fd = self._open_descriptor(key)
        try:
            if buffer is None:
                buffer = _buffer_for(fd, start, end)
            while filled < len(buffer):
                try:
                    read = os.preadv(fd, [buffer[filled:]], start + filled)
                except IsADirectoryError as exc:  # a folder of other keys opens, not reads
                    raise NotFoundError(f"object {key!r} does not exist") from exc
                if not read:
                    break  # the object shrank: it was replaced by a shorter one
                filled += read
            return buffer, filled
        finally:
            os.close(fd)

    async def _get_stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        self._check_open()
        self.stats.record(RequestKind.GET)
        file = await self._run(self._open_object, key)
        try:
            while chunk := await self._run(file.read, chunk_size):
                self.stats.record(RequestKind.GET, len(chunk), requests=0)
                yield chunk
        finally:
            # Closing a file opened for reading flushes nothing, so it cannot block the loop.
            file.close()

    async def _head(self, key: str) -> ObjectInfo | None:
        self._check_open()
        self.stats.record(RequestKind.HEAD)
        return await self._run(self._stat_object, key)

    async def _delete(self, key: str) -> None:
        self._check_open()
        self.stats.record(RequestKind.DELETE)
        await self._run(self._delete_file, key)

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        self._check_open()
        self.stats.record(RequestKind.LIST)
        folder_key, _, name_prefix = prefix.rpartition("/")
        folder = self._path_of(folder_key) if folder_key else self._root
        key_prefix = f"{folder_key}/" if folder_key else ""
        walker = _walk_sorted(folder, key_prefix, name_prefix)
        # The walk is a plain generator resumed page by page on the pool: one thread at a time.
        while page := await self._run(_take, walker, _LIST_PAGE):
            for info in page:
                yield info

    # --- plumbing --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._files.closed:
            raise ClosedError(f"{self._files.name} is closed")

    async def _run(self, fn: Callable[[Unpack[Ts]], T], *args: *Ts) -> T:
        """Run blocking ``fn(*args)`` on the pool; OS errors leave as :class:`StorageError`."""
        return await self._files.call("", fn, *args)

    def _translate(self, exc: Exception, what: str) -> Exception:
        return file_error(exc, f"local object store at {self._root!r}")

    async def _discard(self, temp: _TempFile) -> None:
        try:
            await self._files.run(temp.discard)
        except ClosedError:
            temp.discard()  # close() has begun: clean up here instead

    def _make_spare(self) -> None:
        """Make the next put's temporary file soon, on the pool, unless that is under way."""
        if self._making_spare is None or self._making_spare.done():
            self._making_spare = asyncio.create_task(self._make_spare_file())

    async def _make_spare_file(self) -> None:
        # Only a head start: a put that finds no spare makes its own file.
        await asyncio.sleep(SPARE_DELAY_S)
        with contextlib.suppress(ClosedError, OSError):
            await self._files.run(self._spare.make)

    def _url(self, key: str) -> str:
        return Path(self._root, *key.split("/")).as_uri()

    def _path_of(self, key: str) -> str:
        """The file of ``key``, refusing anything that would land outside the root."""
        path = os.path.normpath(os.path.join(self._root, key))
        if not path.startswith(self._root + os.sep):
            raise ValueError(f"object key {key!r} resolves outside the store root")
        return path

    # --- blocking operations, run on the pool ----------------------------------------------

    def _put_file(
        self, key: str, data: bytes | bytearray | memoryview, if_absent: bool
    ) -> ObjectInfo:
        final = self._path_of(key)
        temp = self._spare.take()
        try:
            temp.write(data)
            info = temp.seal(key)
            self._commit(temp.path, key, final, if_absent)
            return info
        finally:
            temp.discard()

    def _commit(self, temp: str, key: str, final: str, if_absent: bool) -> None:
        """Move the sealed temporary file to the key, atomically."""
        for _ in range(_COMMIT_ATTEMPTS):
            try:
                self._make_parents(final, key)
                if if_absent:
                    os.link(temp, final)
                else:
                    os.replace(temp, final)
            except FileNotFoundError:
                if not os.path.exists(temp):
                    raise StorageError(f"the temporary file of {key!r} vanished") from None
                # A concurrent delete pruned a folder just made for this key: make it again.
                continue
            except FileExistsError:
                if os.path.isdir(final):
                    raise _folder_conflict(key) from None
                raise AlreadyExistsError(f"object {key!r} already exists") from None
            except (IsADirectoryError, NotADirectoryError) as exc:
                raise _folder_conflict(key) from exc
            fsync_folder(os.path.dirname(final))
            return
        raise StorageError(f"could not create the folders of {key!r}: they keep being removed")

    def _make_parents(self, path: str, key: str) -> None:
        """Create the missing folders above ``path``, each made durable in its parent."""
        missing = []
        folder = os.path.dirname(path)
        while folder != self._root and not os.path.isdir(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:
                if _is_file(folder):
                    raise _folder_conflict(key) from None
                # A concurrent writer made it (and a concurrent delete may have removed it
                # since: the next mkdir or the commit then fails and is retried).
                continue
            fsync_folder(os.path.dirname(folder))

    def _open_object(self, key: str) -> IO[bytes]:
        try:
            return open(self._path_of(key), "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise NotFoundError(f"object {key!r} does not exist") from exc

    def _open_descriptor(self, key: str) -> int:
        # A bare descriptor and pread: a catch-up read makes many of these, and an io.FileIO
        # with its buffered reader costs more than the system calls themselves.
        try:
            return os.open(self._path_of(key), os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise NotFoundError(f"object {key!r} does not exist") from exc

    def _read_range(self, key: str, start: int, end: int | None) -> bytes:
        fd = self._open_descriptor(key)
        try:
            if end is None:
                end = max(start, os.fstat(fd).st_size)
            parts = []
            position = start
            while position < end:
                try:
                    part = os.pread(fd, end - position, position)
                except IsADirectoryError as exc:  # a folder of other keys opens, not reads
                    raise NotFoundError(f"object {key!r} does not exist") from exc
                if not part:
                    break  # the object is shorter: the range is clipped at its end
                parts.append(part)
                position += len(part)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        finally:
            os.close(fd)

    def _stat_object(self, key: str) -> ObjectInfo | None:
        try:
            info = os.stat(self._path_of(key))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not stat.S_ISREG(info.st_mode):
            return None  # a folder of other keys, not an object
        return ObjectInfo(key, info.st_size, info.st_mtime)

    def _delete_file(self, key: str) -> None:
        path = self._path_of(key)
        if os.path.isdir(path):
            return  # a folder of other keys: no object has this key
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return
        # Not fsync-ed: a delete lost in a crash is simply repeated by the next cleanup.
        self._prune_empty_folders(os.path.dirname(path))

    def _prune_empty_folders(self, folder: str) -> None:
        """Remove ``folder`` and its ancestors below the root while they are empty.

        ``rmdir`` removes only an empty folder, atomically; a writer that loses its folder this
        way makes it again (see :meth:`_commit`).
        """
        while folder != self._root:
            try:
                os.rmdir(folder)
            except OSError:
                return  # not empty (still used, or refilled meanwhile) or already removed
            folder = os.path.dirname(folder)


class _TempFile:
    """A file in the temporary folder that becomes an object on commit, or disappears."""

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, f"{uuid.uuid4().hex}.part")
        self._file = open(self.path, "xb")  # noqa: SIM115 - closed by seal() or discard()
        self.made_at = time.monotonic()
        self._unsynced = 0
        """Bytes written since the last fdatasync (:data:`WRITE_BACK_BYTES`)."""

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        for at in range(0, len(view), WRITE_BACK_BYTES):
            piece = view[at : at + WRITE_BACK_BYTES]
            self._file.write(piece)
            self._unsynced += len(piece)
            if self._unsynced >= WRITE_BACK_BYTES:
                self._file.flush()
                os.fdatasync(self._file.fileno())
                self._unsynced = 0

    def seal(self, key: str) -> ObjectInfo:
        """Make the content durable and close the file; report what the object will be."""
        self._file.flush()
        os.fsync(self._file.fileno())
        info = os.fstat(self._file.fileno())
        self._file.close()
        return ObjectInfo(key, info.st_size, info.st_mtime)

    def discard(self) -> None:
        """Close and remove the file; harmless after a commit that consumed it."""
        # A write cancelled in another thread may still run: close() waits for it (the
        # buffered file's lock), so the file is never removed under a live write.
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class _SpareTempFile:
    """One temporary file made ahead of the next put (on the pool, after each put).

    Creating a file costs as much as a small put's fsyncs on some filesystems (0.7 ms on an
    ext4 virtual disk, against 0.4 ms for the fsync of 30 KB): a producer sending a request
    every few milliseconds waits for one WAL put each, and the spare takes the creation off
    that path. A spare older than :data:`SPARE_MAX_AGE_S` is not used: another process's start
    may already have taken it for a dead writer's file, if it lay unused long enough.
    """

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._lock = threading.Lock()
        self._file: _TempFile | None = None

    def take(self) -> _TempFile:
        """The spare if there is a fresh one, else a new file (blocking)."""
        with self._lock:
            spare, self._file = self._file, None
        if spare is not None:
            if time.monotonic() - spare.made_at < SPARE_MAX_AGE_S:
                return spare
            spare.discard()
        return _TempFile(self._folder)

    def make(self) -> None:
        """Make the spare if there is none (blocking)."""
        if self._file is None:
            made = _TempFile(self._folder)
            if not self._keep(made):
                made.discard()  # another thread made one meanwhile

    def _keep(self, made: _TempFile) -> bool:
        with self._lock:
            if self._file is None:
                self._file = made
                return True
            return False

    def discard(self) -> None:
        with self._lock:
            spare, self._file = self._file, None
        if spare is not None:
            spare.discard()


def _absolute(path: Path) -> Path:
    """``path`` made absolute and free of ``..``, without following symbolic links."""
    return Path(os.path.normpath(path.absolute()))


def temp_folder_of(root: Path) -> Path:
    """The folder of temporary files for the store at ``root``: a hidden sibling of it."""
    return root.parent / f".{root.name}{TEMP_FOLDER_SUFFIX}"


def _prepare_folders(root: Path, temp_dir: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    temp_dir.mkdir(exist_ok=True)
    if root.stat().st_dev != temp_dir.stat().st_dev:
        raise ConfigError(
            f"[object_store] root = {str(root)!r} is a mount point: atomic writes need "
            f"{str(temp_dir)!r} on the same filesystem; use a folder inside the mount instead"
        )
    _remove_stale_temp_files(temp_dir)


def _remove_stale_temp_files(temp_dir: Path) -> None:
    cutoff = time.time() - STALE_TEMP_SECONDS
    with os.scandir(temp_dir) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):  # another process removed it first
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)


def _walk_sorted(folder: str, key_prefix: str, name_prefix: str = "") -> Iterator[ObjectInfo]:
    """The objects below ``folder`` whose names start with ``name_prefix``, in key order.

    Within a folder, a subfolder ``x`` sorts as ``x/``: every key below it starts with ``x/``,
    and no sibling name starts with ``x/``, so the subtree's keys sit exactly where ``x/`` does
    in plain string (= UTF-8 byte) order.
    """
    try:
        with os.scandir(folder) as scan:
            entries = [entry for entry in scan if entry.name.startswith(name_prefix)]
    except (FileNotFoundError, NotADirectoryError):
        return  # nothing there, or removed by a concurrent delete
    entries.sort(key=_sort_name)
    for entry in entries:
        key = key_prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            yield from _walk_sorted(entry.path, key + "/")
        elif entry.is_file(follow_symlinks=False):
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted since the folder was read
            yield ObjectInfo(key, info.st_size, info.st_mtime)


def _sort_name(entry: os.DirEntry[str]) -> str:
    return entry.name + "/" if entry.is_dir(follow_symlinks=False) else entry.name


def _take(iterator: Iterator[T], count: int) -> list[T]:
    return list(itertools.islice(iterator, count))


def _is_file(path: str) -> bool:
    """Whether ``path`` exists and is not a folder (one ``lstat``, so one consistent answer)."""
    try:
        return not stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _folder_conflict(key: str) -> StorageError:
    return StorageError(
        f"object key {key!r} clashes with a folder of other keys: the local object store "
        "cannot hold both 'a' and 'a/b'"
    )


def _buffer_for(fd: int, start: int, end: int | None) -> memoryview:
    """An uninitialised buffer for bytes ``[start, end)`` of the open file, clipped at its
    size: a read fills it, so zeroing it first (as ``bytearray(n)`` does) would be wasted
    work."""
    size = os.fstat(fd).st_size
    stop = size if end is None else min(end, size)
    return uninitialised_buffer(stop - start)
