"""Which process holds a loopback TCP connection: how the fault proxies tell which broker (or
which of its child processes) is at the other end of a connection they accepted."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.broker import child_pids


def socket_holder(local_port: int, candidates: list[int]) -> tuple[int, int] | None:
    """``(candidate, holder)``: the process holding the TCP socket bound to ``local_port``,
    among ``candidates`` and their children, and the candidate it is or descends from."""
    inodes = _socket_inodes(local_port)
    if not inodes:
        return None
    for candidate in candidates:
        for pid in [candidate, *_children_of(candidate)]:
            if _holds_any(pid, inodes):
                return candidate, pid
    return None


def _children_of(pid: int) -> list[int]:
    try:
        return child_pids(pid)
    except OSError:
        return []  # gone meanwhile


def _holds_any(pid: int, inodes: set[str]) -> bool:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def _socket_inodes(local_port: int) -> set[str]:
    """Inodes of the TCP sockets (IPv4 or IPv6) whose local port is ``local_port``."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == local_port:
                inodes.add(fields[9])
    return inodes
