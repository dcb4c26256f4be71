"""The side-by-side harness reads a process's CPU time and page faults from /proc."""

from __future__ import annotations

import mmap
import os

from tests.bench.sidebyside import procstats

PAGE = mmap.PAGESIZE


def test_page_faults_count_the_fresh_pages_a_process_touches() -> None:
    pages = 4096
    before = procstats.own_page_faults(os.getpid())
    with mmap.mmap(-1, pages * PAGE) as fresh:
        fresh.madvise(mmap.MADV_NOHUGEPAGE)  # a fault per page, whatever the host's THP setting
        for page in range(pages):
            fresh[page * PAGE] = 1
        after = procstats.own_page_faults(os.getpid())
    assert after - before >= pages


def test_a_process_that_is_gone_has_no_figures() -> None:
    gone = 2**22 + 1  # above the kernel's largest process id
    assert procstats.own_page_faults(gone) == 0
    assert procstats.own_cpu_seconds(gone) == 0.0
    assert procstats.cpu_seconds(gone) == 0.0


def test_cpu_seconds_grow_with_work() -> None:
    before = procstats.own_cpu_seconds(os.getpid())
    total = 0
    while procstats.own_cpu_seconds(os.getpid()) - before < 0.05:
        total += sum(range(10_000))
    assert procstats.cpu_seconds(os.getpid()) >= procstats.own_cpu_seconds(os.getpid()) > before
