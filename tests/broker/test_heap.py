"""A broker's heap gives its free pages back after a burst, and is left alone otherwise."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from icefloe.broker import heap
from icefloe.embedded import file_io

MIB = 1 << 20


class FakeLibc:
    """The two allocator calls the trimmer makes, over a resident size and an allocated size
    the test sets."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, resident: int, allocated: int) -> None:
        self.resident = resident
        self.allocated = allocated
        self.trims = 0
        monkeypatch.setattr(heap, "resident_bytes", lambda: self.resident)

    def mallinfo2(self) -> Any:
        return heap._MallInfo2(uordblks=self.allocated)

    def malloc_trim(self, pad: int) -> int:
        self.trims += 1
        self.resident = self.allocated + 100 * MIB  # what the process holds besides the heap
        return 1


def test_the_free_pages_left_by_a_burst_are_returned_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    libc = FakeLibc(monkeypatch, resident=200 * MIB, allocated=100 * MIB)
    trimmer = heap.HeapTrimmer(libc, trim_bytes=64 * MIB)  # type: ignore[arg-type]
    libc.resident, libc.allocated = 500 * MIB, 380 * MIB  # the burst: in use, nothing to trim
    assert not trimmer.trim_if_worth_it()

    libc.allocated = 110 * MIB  # the burst is over: its memory is free but still resident

    assert trimmer.trim_if_worth_it()
    assert libc.resident == 210 * MIB
    assert not trimmer.trim_if_worth_it()  # nothing piled up since
    assert libc.trims == 1


def test_growth_in_use_or_below_the_threshold_is_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    libc = FakeLibc(monkeypatch, resident=200 * MIB, allocated=100 * MIB)
    trimmer = heap.HeapTrimmer(libc, trim_bytes=64 * MIB)  # type: ignore[arg-type]
    libc.resident, libc.allocated = 600 * MIB, 500 * MIB  # all of it in use
    assert not trimmer.trim_if_worth_it()
    libc.resident = 663 * MIB  # 63 MiB unallocated more than before

    assert not trimmer.trim_if_worth_it()
    assert libc.trims == 0


M_TRIM_THRESHOLD = -1
DEFAULT_TRIM_THRESHOLD = 128 << 10


@pytest.fixture
def heap_kept_when_freed() -> Iterator[ctypes.CDLL]:
    """This process's allocator as a broker's, but without glibc's own trimming of the heap's
    top, so that whether the free blocks stay depends on nothing else in the process."""
    assert heap.reuse_large_blocks() is not None, "the broker's heap trimming needs glibc 2.33+"
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = heap._MallInfo2
    libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
    yield libc
    libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)


def test_on_glibc_the_free_blocks_of_a_burst_go_back_to_the_system(
    heap_kept_when_freed: ctypes.CDLL,
) -> None:
    libc = heap_kept_when_freed
    trimmer = heap.HeapTrimmer(libc, trim_bytes=64 * MIB)
    blocks, pins = [], []
    for _ in range(400):  # 200 MiB in heap blocks (zeroed: resident), each followed by a
        blocks.append(bytearray(512 << 10))  # small live one
        pins.append(bytearray(4096))
    del blocks  # free now, in the middle of the heap between the pins
    resident_before = heap.resident_bytes()

    assert trimmer.trim_if_worth_it()
    assert heap.resident_bytes() < resident_before - 150 * MIB
    del pins


def _arrow_allocators(environment: dict[str, str]) -> tuple[str, str, bool]:
    """In a fresh interpreter with ``environment`` added: Arrow's allocator before and after
    :func:`heap.arrow_from_jemalloc`, and whether that pyarrow has a jemalloc pool at all."""
    script = (
        "import pyarrow as pa\n"
        "from icefloe.broker.heap import arrow_from_jemalloc\n"
        "before = pa.default_memory_pool().backend_name\n"
        "try:\n"
        "    pa.jemalloc_memory_pool(); has = True\n"
        "except NotImplementedError:\n"
        "    has = False\n"
        "print(before, arrow_from_jemalloc(), has)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env | environment,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    before, after, has = done.stdout.split()
    return before, after, has == "True"


def test_arrows_buffers_come_from_jemalloc_where_pyarrow_has_it() -> None:
    before, after, has_jemalloc = _arrow_allocators({})
    assert after == ("jemalloc" if has_jemalloc else before)
    assert before != "jemalloc"  # else this test would show nothing


def test_an_operators_choice_of_arrows_allocator_stands() -> None:
    before, after, _ = _arrow_allocators({"ARROW_DEFAULT_MEMORY_POOL": "system"})
    assert before == after == "system"


def test_the_local_stores_take_from_arrow_exactly_the_blocks_glibc_maps_on_their_own() -> None:
    assert file_io.LARGE_BUFFER_BYTES == heap.MMAP_THRESHOLD_BYTES
    small = file_io.uninitialised_buffer(heap.MMAP_THRESHOLD_BYTES - 1)
    large = file_io.uninitialised_buffer(heap.MMAP_THRESHOLD_BYTES)
    assert isinstance(small.obj, np.ndarray)
    assert isinstance(large.obj, pa.Buffer)
    assert large.format == "B"
    assert not large.readonly
