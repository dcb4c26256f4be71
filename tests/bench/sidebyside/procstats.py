"""A server's CPU time and peak memory, read from /proc (Linux only).

A server is a set of root processes (Kafka's one JVM; Icefloe's broker processes) together
with every process they started (Icefloe's compactor processes and their compaction workers),
because all of that is work the server does for its clients.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

from tests.support.broker import child_pids

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(roots: Iterable[int]) -> list[int]:
    """``roots`` and all their live descendants."""
    seen: list[int] = []
    pending = list(roots)
    while pending:
        pid = pending.pop()
        if pid in seen or not Path(f"/proc/{pid}").exists():
            continue
        seen.append(pid)
        pending.extend(child_pids(pid))
    return sorted(seen)


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (``None`` if gone): index
    ``n - 3`` holds field ``n`` of proc(5)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; fields after it are plain.
    return stat[stat.rindex(")") + 2 :].split()


def cpu_seconds(pid: int) -> float:
    """user + system time of a process and of its children it has waited for (0 if gone)."""
    fields = _stat(pid)
    return 0.0 if fields is None else sum(map(int, fields[11:15])) / CLOCK_TICKS


def own_cpu_seconds(pid: int) -> float:
    """user + system time of the process itself (all its threads), without any child (0 if
    gone)."""
    fields = _stat(pid)
    return 0.0 if fields is None else sum(map(int, fields[11:13])) / CLOCK_TICKS


def own_page_faults(pid: int) -> int:
    """Minor page faults of the process itself so far (0 if gone): each a page the kernel
    mapped in, most of them fresh memory it zeroed first."""
    fields = _stat(pid)
    return 0 if fields is None else int(fields[7])


def peak_rss_mib(pid: int) -> float:
    """VmHWM, the process's peak resident set since it started or since
    :func:`reset_peak_rss`, in MiB (0 if gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def server_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds the server's processes have used so far (subtract two readings)."""
    return sum(cpu_seconds(pid) for pid in process_tree(roots))


def broker_cpu_seconds(roots: Iterable[int]) -> float:
    """CPU seconds the root processes alone have used so far: what serves the clients, without
    Icefloe's compactor processes and compaction workers (for Kafka, the same as
    :func:`server_cpu_seconds`)."""
    return sum(own_cpu_seconds(pid) for pid in roots)


def broker_page_faults(roots: Iterable[int]) -> int:
    """Minor page faults of the root processes alone so far (subtract two readings)."""
    return sum(own_page_faults(pid) for pid in roots)


def server_peak_rss_mib(roots: Iterable[int]) -> float:
    """Sum of the peak RSS of the server's processes (an upper bound of the server's peak)."""
    return sum(peak_rss_mib(pid) for pid in process_tree(roots))


def reset_peak_rss(roots: Iterable[int]) -> None:
    """Start the server's processes' peaks afresh from their resident sets now, so that a
    workload's peak is its own, not an earlier stage's (Linux's ``clear_refs``, 5). Processes
    that are gone, or whose peak may not be reset, keep theirs."""
    for pid in process_tree(roots):
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")
