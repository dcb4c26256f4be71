"""Small file-system pieces the embedded backends that keep files on this machine share."""

from __future__ import annotations

import errno
import os
from typing import Any, Final

import numpy as np
import pyarrow as pa

from icefloe.errors import StorageError, UnavailableError

NOWAIT: Final = getattr(os, "RWF_NOWAIT", None)
"""preadv's flag to read only what the page cache holds (Linux); without it every read goes
to a thread pool."""
READ_FROM_CACHE_AT_ONCE: Final = 8 << 20
"""Most bytes a ranged read copies from the page cache on the event loop (about a
millisecond's work, less than a thread hop costs); a larger one goes to the pool whole."""
NO_SPACE: Final = frozenset({errno.ENOSPC, errno.EDQUOT})
"""Errors of a full disk (or a used-up quota): the write left nothing behind, and succeeds
again once space is freed."""
LARGE_BUFFER_BYTES: Final = 1 << 20
"""A block glibc's allocator maps on its own in a broker (its ``MMAP_THRESHOLD_BYTES``)."""


def uninitialised_buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes: a read fills it, so zeroing it first (as
    ``bytearray(size)`` does) would be wasted work.

    A buffer of :data:`LARGE_BUFFER_BYTES` or more comes from Arrow's allocator, which in a
    broker keeps freed pages for a while (:func:`icefloe.broker.heap.arrow_from_jemalloc`):
    glibc maps each such block afresh, and the reads of a catch-up from Parquet (a few row
    groups' column chunks, megabytes at a time) faulted in about 150,000 pages per gigabyte
    read. Smaller ones come from glibc's heap, which reuses them as they are."""
    if size < LARGE_BUFFER_BYTES:
        array: Any = np.empty(max(0, size), dtype=np.uint8)  # numpy's stubs lack Buffer
        return memoryview(array)
    return memoryview(pa.allocate_buffer(size)).cast("B")  # bytes, not Arrow's signed chars


def fsync_folder(folder: str) -> None:
    """Make the folder's entries (files created, renamed or removed in it) durable."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_error(exc: Exception, where: str) -> StorageError:
    """The error for an OS error of a file store: retriable when the disk is full, since a
    failed write is discarded whole and the same write succeeds once space is freed."""
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return UnavailableError(f"{where}: the disk is full ({exc}); free space on it")
    return StorageError(f"{where}: {exc}")
