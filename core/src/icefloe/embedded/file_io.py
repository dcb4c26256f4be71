"""Small file-system pieces the embedded backends that keep files on this machine share."""

from __future__ import annotations

import os
from typing import Any, Final

import numpy as np

NOWAIT: Final = getattr(os, "RWF_NOWAIT", None)
"""preadv's flag to read only what the page cache holds (Linux); without it every read goes
to a thread pool."""
READ_FROM_CACHE_AT_ONCE: Final = 8 << 20
"""Most bytes a ranged read copies from the page cache on the event loop (about a
millisecond's work, less than a thread hop costs); a larger one goes to the pool whole."""


def uninitialised_buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes: a read fills it, so zeroing it first (as
    ``bytearray(size)`` does) would be wasted work."""
    array: Any = np.empty(max(0, size), dtype=np.uint8)  # numpy's stubs lack Buffer
    return memoryview(array)


def fsync_folder(folder: str) -> None:
    """Make the folder's entries (files created, renamed or removed in it) durable."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
