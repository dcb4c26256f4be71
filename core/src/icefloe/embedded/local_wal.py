"""The local WAL: WAL objects appended to segment files on this machine's disk.

Why not a file per WAL object, as the object-store WAL keeps them on the local object store:
there every flush creates a file (ext4 then searches its inode bitmap past the inodes of the
WAL objects garbage collection freed), syncs it, renames it into place and syncs its folder: two
journal commits and an inode allocation per flush, several times what the flush's bytes cost.
Appending to a file that is already there costs one data sync.

Layout: a folder (``path``, default ``<data dir>/wal``) of segment files named
``<ms>-<uuid>.seg`` (the creation time in milliseconds, 13 digits, then a random id). Each
process appends to a segment of its own and holds an exclusive ``flock`` on it for as long as
it may append; past ``segment_bytes`` it starts the next one. A WAL object is one record: a
header (magic, payload length, creation time, a CRC-32C of those three, then a flags word)
followed by the payload. Its reference is ``<segment>:<position>:<length>``, so a reader goes
straight to it; the header is checked on every read, so a reference that does not point at a
live record of that length is not found.

Durability: a segment's records are written in position order under a lock and then made
durable by ``fdatasync``; one sync covers every record written before it began. A failed
write or sync fails every append not yet durable in that segment and retires it (the next
append starts a new one), so an acknowledged record is never preceded by one that may be
lost: the records of a segment up to its first invalid header are all that anyone can
reference. A crash leaves at most a torn record at the end, which no reference names.

Deletion sets the record's flag (not synced: a mark lost in a crash is made again by the next
garbage collection, which lists the record as an orphan). :meth:`LocalWAL.list` removes a
segment's file once it holds records, every one of them marked, and no writer holds its lock
(a dead writer's lock died with it).

Every process of a cluster must see the same folder: this WAL serves brokers on one machine
(a POSIX one: it needs ``flock`` and ``pwritev``).

Switching from the object-store WAL loses nothing: with an object store configured, the WAL
objects that the object WAL left in it (under its configured prefix) stay readable through this
WAL, and are listed and deleted through it, so garbage collection removes them once compaction
has moved their records to the tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import functools
import os
import re
import struct
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

from crc32c import crc32c
from pydantic import Field

from icefloe.adapters.blocking import BlockingSdk
from icefloe.embedded.file_io import (
    NOWAIT,
    READ_FROM_CACHE_AT_ONCE,
    file_error,
    fsync_folder,
    uninitialised_buffer,
)
from icefloe.embedded.object_wal import ObjectWAL
from icefloe.errors import ClosedError, NotFoundError, StorageError
from icefloe.ports.base import BackendOptions, OpenContext
from icefloe.ports.wal import WAL, WalObjectInfo

SUFFIX: Final = ".seg"
MAGIC: Final = b"IFWL"
DELETED: Final = 0x1
_FIELDS: Final = struct.Struct("<4sQQ")
"""A header's first part: magic, payload length, creation time (ms since the epoch)."""
_CRC: Final = struct.Struct("<I")
"""Then the CRC-32C of the fields (not of the flags, which deletion changes)."""
_FLAGS: Final = struct.Struct("<I")
_FLAGS_AT: Final = _FIELDS.size + _CRC.size
HEADER_BYTES: Final = _FLAGS_AT + _FLAGS.size
_IOV_MAX: Final = os.sysconf("SC_IOV_MAX") if "SC_IOV_MAX" in os.sysconf_names else 1024
"""The most buffers one ``pwritev`` takes; an object's parts (one per batch) may be more."""
_SEGMENT_NAME: Final = re.compile(r"\d{13}-[0-9a-f]{32}")
_REF: Final = re.compile(r"(\d{13}-[0-9a-f]{32}):(\d{1,15}):(\d{1,15})")
STALE_EMPTY_SEGMENT_S: Final = 3600.0
"""A segment without a single record this old belongs to a writer that died before its first
append (a live one writes its first record right after creating the file)."""


class LocalWALOptions(BackendOptions):
    """Options of ``[wal] backend = "local"``."""

    path: str | None = None
    """Folder of the segment files; default ``<data dir>/wal``."""
    segment_bytes: int = Field(default=64 << 20, ge=1 << 12, le=1 << 32)
    """Size past which a process starts a new segment. A segment's file goes once every WAL
    object in it is released, so larger segments mean fewer files and more disk held."""
    io_threads: int = Field(default=4, ge=1, le=64)
    """Size of the thread pool for writes, syncs and reads that the page cache cannot answer."""


@dataclass(frozen=True, slots=True)
class _Record:
    position: int
    length: int
    created: float
    deleted: bool


class LocalWAL(WAL):
    """WAL objects as records in segment files; see the module docstring."""

    options_model = LocalWALOptions

    def __init__(
        self,
        folder: Path,
        segment_bytes: int = 64 << 20,
        io_threads: int = 4,
        earlier: WAL | None = None,
    ) -> None:
        """Use an existing ``folder``; :meth:`open` is the usual way in.

        Args:
            earlier: The WAL whose objects the index may still reference (the object WAL of
                the configured object store): read, listed and deleted through this one.
        """
        self._earlier = earlier
        self._folder = str(folder)
        self._segment_bytes = segment_bytes
        self._files = BlockingSdk(
            f"the local WAL at {self._folder!r}",
            threads=io_threads,
            thread_name_prefix="icefloe-local-wal",
            translate=self._translate,
            sdk_types=(OSError,),
        )
        self._current: _Segment | None = None
        self._opening: asyncio.Task[None] | None = None
        self._open_segments: set[_Segment] = set()

    @classmethod
    async def open(cls, options: LocalWALOptions, context: OpenContext) -> Self:
        """Create the folder if needed and open the WAL.

        Raises:
            StorageError: the folder cannot be created.
        """
        folder = Path(options.path or context.data_dir / "wal")
        try:
            folder = await asyncio.to_thread(_made_folder, folder)
        except OSError as exc:
            raise StorageError(f"[wal] local path = {str(folder)!r} is not usable: {exc}") from exc
        earlier = None
        if context.object_store is not None:
            earlier = ObjectWAL(context.object_store, _object_wal_prefix(context.config))
        return cls(folder, options.segment_bytes, options.io_threads, earlier)

    async def close(self) -> None:
        """Refuse new calls, wait for the running ones, and let go of this process's segments."""
        await self._files.close()
        if self._opening is not None:
            with contextlib.suppress(Exception):
                await self._opening
        for segment in self._open_segments:
            segment.close()
        self._open_segments.clear()
        self._current = None
        if self._earlier is not None:
            await self._earlier.close()

    @property
    def billed_per_append(self) -> bool:
        return False

    @property
    def reads_from_page_cache(self) -> bool:
        return True

    # --- append -----------------------------------------------------------------------------

    async def _append(self, data: bytes | bytearray | memoryview) -> str:
        return await self._append_parts([memoryview(data).cast("B")])

    async def _append_parts(self, parts: list[memoryview]) -> str:
        # The parts go to the file as they are: the kernel's copy, in a pool thread, is the
        # only one.
        self._check_open()
        length = sum(len(part) for part in parts)
        segment = await self._segment_for(HEADER_BYTES + length)
        segment.users += 1
        # Taken before the write, so a record's time never lies in its future.
        created_ms = time.time_ns() // 1_000_000
        write = asyncio.ensure_future(
            self._files.call(
                f"append to segment {segment.name}", segment.append, parts, length, created_ms
            )
        )
        # The segment is let go when the write ends, not when an append cancelled meanwhile
        # stops waiting: its file stays open while a pool thread still writes to it.
        write.add_done_callback(functools.partial(self._write_ended, segment))
        position = await asyncio.shield(write)
        return f"{segment.name}:{position}:{length}"

    def _write_ended(self, segment: _Segment, write: asyncio.Future[int]) -> None:
        if not write.cancelled():
            write.exception()  # its appender hears of it, unless it was cancelled meanwhile
        segment.users -= 1
        if segment.failed is not None:
            self._retire(segment)
        self._close_if_done(segment)

    async def _segment_for(self, size: int) -> _Segment:
        """The segment the next ``size`` bytes go to, starting a new one when it is full."""
        while True:
            current = self._current
            if (
                current is not None
                and current.failed is None
                and (current.planned == 0 or current.planned + size <= self._segment_bytes)
            ):
                current.planned += size
                return current
            if current is not None:
                self._retire(current)
            if self._opening is None:
                self._opening = asyncio.create_task(self._open_next())
            # Shielded: an append cancelled meanwhile leaves the segment to the others.
            await asyncio.shield(self._opening)

    async def _open_next(self) -> None:
        try:
            segment = await self._files.call("create a segment", _Segment.create, self._folder)
            self._open_segments.add(segment)
            self._current = segment
        finally:
            self._opening = None

    def _retire(self, segment: _Segment) -> None:
        segment.retired = True
        if self._current is segment:
            self._current = None
        self._close_if_done(segment)

    def _close_if_done(self, segment: _Segment) -> None:
        # Closing lets go of the lock: the segment's file may go once its records are released.
        if segment.retired and segment.users == 0 and segment in self._open_segments:
            self._open_segments.discard(segment)
            segment.close()

    # --- read, delete, list -----------------------------------------------------------------

    async def _read(self, ref: str, start: int, end: int | None) -> bytes | memoryview:
        self._check_open()
        if self._earlier is not None and _REF.fullmatch(ref) is None:
            return await self._earlier.read(ref, start, end)
        name, position, length = _parse(ref)
        stop = max(start, length if end is None else min(end, length))
        path = self._path(name)
        cached = _read_cached(path, ref, position, length, start, stop)
        if cached is not None:
            return cached
        return await self._files.call(
            f"read {ref!r}", _read_file, path, ref, position, length, start, stop
        )

    async def _delete(self, ref: str) -> None:
        self._check_open()
        if self._earlier is not None and _REF.fullmatch(ref) is None:
            await self._earlier.delete(ref)
            return
        try:
            name, position, length = _parse(ref)
        except NotFoundError:
            return  # never a reference of this WAL, so nothing to delete
        await self._files.call(f"delete {ref!r}", _mark_deleted, self._path(name), position, length)

    async def _list(self) -> AsyncIterator[WalObjectInfo]:
        self._check_open()
        if self._earlier is not None:
            async for info in self._earlier.list():
                yield info
        names = await self._files.call("list segments", _segment_names, self._folder)
        for name in names:
            records = await self._files.call(f"scan segment {name}", self._scan, name)
            for record in records:
                yield WalObjectInfo(
                    f"{name}:{record.position}:{record.length}", record.length, record.created
                )

    def _scan(self, name: str) -> list[_Record]:
        """The live records of a segment (blocking); removes the file if none is left."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return []  # removed meanwhile by another process's collection
        try:
            stat = os.fstat(fd)
            records = _records(fd, stat.st_size, stat.st_mtime)
            live = [r for r in records if not r.deleted]
            released = bool(records) and not live
            stale = not records and time.time() - stat.st_mtime > STALE_EMPTY_SEGMENT_S
            if (released or stale) and _unlocked(fd):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return live
        finally:
            os.close(fd)

    # --- plumbing ---------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return os.path.join(self._folder, name + SUFFIX)

    def _check_open(self) -> None:
        if self._files.closed:
            raise ClosedError(f"{self._files.name} is closed")

    def _translate(self, exc: Exception, what: str) -> Exception:
        return file_error(exc, f"local WAL at {self._folder!r}: {what}")


class _Segment:
    """The segment a process appends to: its file, and how far it is written and synced.

    ``planned``, ``users`` and ``retired`` belong to the event loop; ``append`` runs on the
    pool, several at once.
    """

    def __init__(self, name: str, fd: int) -> None:
        self.name = name
        self.fd = fd
        self.planned = 0
        """Bytes promised to the appends started: decides when the next segment starts."""
        self.users = 0
        self.retired = False
        self.failed: OSError | None = None
        self._written = 0
        self._synced = 0
        self._write_lock = threading.Lock()
        self._sync_lock = threading.Lock()

    @classmethod
    def create(cls, folder: str) -> _Segment:
        """A new, locked segment file whose name is durable in its folder (blocking)."""
        name = f"{time.time_ns() // 1_000_000:013d}-{uuid.uuid4().hex}"
        path = os.path.join(folder, name + SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fsync_folder(folder)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        return cls(name, fd)

    def append(self, payload: Sequence[memoryview], length: int, created_ms: int) -> int:
        """Write one record of the ``length`` bytes of ``payload``'s parts and return once it
        is durable; its position (blocking)."""
        fields = _FIELDS.pack(MAGIC, length, created_ms)
        header = fields + _CRC.pack(crc32c(fields)) + _FLAGS.pack(0)
        with self._write_lock:
            self._check_usable()
            position = self._written
            try:
                _write_all(self.fd, (header, *payload), position)
            except OSError as exc:
                self.failed = exc
                raise
            self._written = written = position + HEADER_BYTES + length
        with self._sync_lock:
            if self._synced < written:  # else a sync that began after our write covered it
                self._check_usable()
                target = self._written
                try:
                    os.fdatasync(self.fd)
                except OSError as exc:
                    self.failed = exc
                    raise
                self._synced = target
        return position

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def _check_usable(self) -> None:
        if self.failed is not None:
            raise StorageError(
                f"WAL segment {self.name} failed earlier ({self.failed}); the append was not "
                "stored, and the next one goes to a new segment"
            )


def _made_folder(folder: Path) -> Path:
    """``folder``, created if missing, as an absolute path (blocking)."""
    folder.mkdir(parents=True, exist_ok=True)
    return folder.absolute()


def _object_wal_prefix(config: Any) -> str:
    """The prefix the object WAL is configured with (its default without a configuration)."""
    if config is None:
        return "wal"
    return str(config.wal.options_for("object").get("prefix", "wal"))


def _parse(ref: str) -> tuple[str, int, int]:
    matched = _REF.fullmatch(ref)
    if matched is None:
        raise NotFoundError(f"{ref!r} is not a reference of the local WAL")
    return matched[1], int(matched[2]), int(matched[3])


def _header_of(
    raw: bytes | bytearray | memoryview, file_size: int, position: int
) -> _Record | None:
    """The record whose header ``raw`` is, if it is one that fits in the file."""
    if len(raw) < HEADER_BYTES:
        return None
    magic, length, created_ms = _FIELDS.unpack_from(raw)
    (crc,) = _CRC.unpack_from(raw, _FIELDS.size)
    if magic != MAGIC or crc != crc32c(raw[: _FIELDS.size]):
        return None
    if position + HEADER_BYTES + length > file_size:
        return None
    (flags,) = _FLAGS.unpack_from(raw, _FLAGS_AT)
    return _Record(position, length, created_ms / 1000, bool(flags & DELETED))


def _records(fd: int, file_size: int, modified: float) -> list[_Record]:
    """Every record of a segment, up to its first invalid header (a torn or unwritten end)."""
    records = []
    position = 0
    while position + HEADER_BYTES <= file_size:
        record = _header_of(os.pread(fd, HEADER_BYTES, position), file_size, position)
        if record is None:
            break
        # The file's time bounds a writer whose clock ran ahead.
        records.append(dataclasses.replace(record, created=min(record.created, modified)))
        position += HEADER_BYTES + record.length
    return records


def _check_record(
    raw: bytes | bytearray | memoryview, ref: str, position: int, length: int
) -> None:
    record = _header_of(raw, position + HEADER_BYTES + length, position)
    if record is None or record.length != length or record.deleted:
        raise NotFoundError(f"WAL object {ref!r} does not exist")


def _read_cached(
    path: str, ref: str, position: int, length: int, start: int, stop: int
) -> memoryview | None:
    """The range read on the event loop from the page cache, never waiting for the disk;
    ``None`` when the pool must read it: too large, not all cached, or any error (which the
    pool's read then reports)."""
    if NOWAIT is None or stop - start > READ_FROM_CACHE_AT_ONCE:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        header = bytearray(HEADER_BYTES)
        if os.preadv(fd, [header], position, NOWAIT) != HEADER_BYTES:
            return None
        _check_record(header, ref, position, length)
        buffer = uninitialised_buffer(stop - start)
        if not len(buffer):
            return buffer
        read = os.preadv(fd, [buffer], position + HEADER_BYTES + start, NOWAIT)
        return buffer if read == len(buffer) else None
    except OSError:  # EAGAIN: not in the page cache
        return None
    finally:
        os.close(fd)


def _read_file(
    path: str, ref: str, position: int, length: int, start: int, stop: int
) -> memoryview:
    """Bytes ``[start, stop)`` of the record at ``position`` (blocking)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise NotFoundError(f"WAL object {ref!r} does not exist") from exc
    try:
        _check_record(os.pread(fd, HEADER_BYTES, position), ref, position, length)
        buffer = uninitialised_buffer(stop - start)
        filled = 0
        while filled < len(buffer):
            read = os.preadv(fd, [buffer[filled:]], position + HEADER_BYTES + start + filled)
            if not read:
                raise NotFoundError(f"WAL object {ref!r} is cut short in its segment")
            filled += read
        return buffer
    finally:
        os.close(fd)


def _mark_deleted(path: str, position: int, length: int) -> None:
    """Set the deleted flag of the record at ``position``, if it is a live one (blocking)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        raw = os.pread(fd, HEADER_BYTES, position)
        record = _header_of(raw, position + HEADER_BYTES + length, position)
        if record is None or record.length != length or record.deleted:
            return
        (flags,) = _FLAGS.unpack_from(raw, _FLAGS_AT)
        os.pwrite(fd, _FLAGS.pack(flags | DELETED), position + _FLAGS_AT)
    finally:
        os.close(fd)


def _segment_names(folder: str) -> list[str]:
    """The folder's segments, oldest first (their names start with the creation time)."""
    names = []
    with os.scandir(folder) as entries:
        for entry in entries:
            name = entry.name.removesuffix(SUFFIX)
            if entry.name.endswith(SUFFIX) and _SEGMENT_NAME.fullmatch(name):
                names.append(name)
    return sorted(names)


def _unlocked(fd: int) -> bool:
    """Whether no writer holds the segment open ``fd`` is (the lock stays taken until the
    caller closes ``fd``, so no writer can take it back meanwhile)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _write_all(fd: int, parts: Sequence[Any], position: int) -> None:
    views = [memoryview(part) for part in parts]
    while views:
        written = os.pwritev(fd, views[:_IOV_MAX], position)
        if written <= 0:
            raise OSError(f"pwritev wrote nothing at position {position}")
        position += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if views and written:
            views[0] = views[0][written:]
