"""How a broker's large blocks are allocated, and how their memory goes back after a burst.

A broker allocates and frees blocks of about a megabyte all the time: request frames, the
records kio copies out of them, WAL objects, the chunks of fetch responses. Taken from glibc's
heap and reused as they are freed, they cost no more than the copy into them; mapped on their
own, each one costs the kernel a fresh mapping and a page fault per 4 KiB, which was most of
the kernel time a broker spent under a fast producer. So blocks below
``MMAP_THRESHOLD_BYTES`` come from the heap, larger ones (whole fetch responses) are mapped on
their own and unmapped when freed. The local stores' reads that large, and Arrow's buffers, come
from Arrow's jemalloc pool instead (:func:`arrow_from_jemalloc`), which reuses freed pages.

The heap keeps what it frees for reuse, so after a burst a broker's resident size would stay at
its peak. Every ``CHECK_EVERY_S`` a broker compares its resident size with what the allocator
has handed out (``mallinfo2``): the difference, mostly free heap pages still resident, is
watched, and once it has grown by ``TRIM_BYTES`` over its lowest value the allocator returns
its free pages to the system (``malloc_trim``, in a thread). That happens once at the end of a
burst, and again only if reused pages pile up; under steady load the difference stays put.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
from typing import Final

MMAP_THRESHOLD_BYTES: Final = 1 << 20
CHECK_EVERY_S: Final = 1.0
TRIM_BYTES: Final = 32 << 20
_M_MMAP_THRESHOLD: Final = -3
"""mallopt's parameter number for the mmap threshold (glibc's malloc.h)."""
_M_TRIM_THRESHOLD: Final = -1
"""mallopt's parameter number for how much free memory at the heap's top ``free`` gives back
at once (128 KiB by default)."""


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (malloc.h), every field a ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def reuse_large_blocks() -> HeapTrimmer | None:
    """Serve blocks up to ``MMAP_THRESHOLD_BYTES`` from the heap; return the trimmer that gives
    its free pages back after bursts.

    Where the C library cannot tell how much of its heap is in use (not glibc 2.33 or later),
    blocks over 128 KiB are mapped on their own instead, so that freeing one returns it, and
    there is nothing to trim.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None  # not glibc: its allocator, its rules
    try:
        libc.mallinfo2.restype = _MallInfo2
    except AttributeError:
        libc.mallopt(_M_MMAP_THRESHOLD, 128 << 10)
        return None
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    # Left at its default, free() would give back the top of the heap as soon as a block of
    # more than 128 KiB there is freed, and the next block would fault its pages in again: the
    # trimmer gives them back after bursts instead.
    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES)
    return HeapTrimmer(libc)


def arrow_from_jemalloc() -> str:
    """Take Arrow's buffers from its jemalloc pool, where pyarrow has one; return the name of
    the allocator Arrow now uses.

    A catch-up read from Parquet decodes and rebuilds row groups in threads and frees them on
    the event loop. Arrow's default pool, mimalloc, then kept faulting in fresh huge pages and
    zeroing them: 8 % of a broker's CPU during such a read (``clear_page_erms`` in ``perf``),
    2 % with jemalloc, which keeps freed pages for about a second before it gives them back.
    An operator's ``ARROW_DEFAULT_MEMORY_POOL`` is left to stand.
    """
    import pyarrow as pa  # the supervising process never imports pyarrow

    if "ARROW_DEFAULT_MEMORY_POOL" not in os.environ:
        # A pyarrow built without jemalloc (not the Linux wheels) keeps its default.
        with contextlib.suppress(NotImplementedError):
            pa.set_memory_pool(pa.jemalloc_memory_pool())
    return str(pa.default_memory_pool().backend_name)


def resident_bytes() -> int:
    """This process's resident set size (0 where ``/proc`` is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class HeapTrimmer:
    """Returns the heap's free pages once enough of them have piled up resident."""

    def __init__(self, libc: ctypes.CDLL, trim_bytes: int = TRIM_BYTES) -> None:
        self._libc = libc
        self._trim_bytes = trim_bytes
        self._floor = self.resident_unallocated_bytes()
        """The lowest resident-but-unallocated size seen since the last trim."""

    def resident_unallocated_bytes(self) -> int:
        """Resident bytes the allocator has not handed out: free heap pages still resident,
        plus what the allocator does not manage (code, the interpreter's own arenas)."""
        info = self._libc.mallinfo2()
        return resident_bytes() - int(info.uordblks) - int(info.hblkhd)

    def trim_if_worth_it(self) -> bool:
        """Trim if ``trim_bytes`` more are resident and unallocated than at the lowest since
        the last trim; whether it did. Blocking: a trim walks the heap's free blocks."""
        unallocated = self.resident_unallocated_bytes()
        self._floor = min(self._floor, unallocated)
        if unallocated - self._floor < self._trim_bytes:
            return False
        self._libc.malloc_trim(0)
        self._floor = self.resident_unallocated_bytes()
        return True

    async def run(self, check_every_s: float = CHECK_EVERY_S) -> None:
        """Until cancelled: look every ``check_every_s``, off the event loop."""
        while True:
            await asyncio.sleep(check_every_s)
            await asyncio.to_thread(self.trim_if_worth_it)
