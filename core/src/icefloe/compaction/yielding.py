"""Compaction that yields to a busy host.

Compaction is background work. While the broker's clients keep a host's cores busy, a
compactor that decodes and encodes beside them takes CPU from produce and fetch requests (on a
two-core host, about a quarter of a producer's throughput). So before it plans a run, and
before its local engine starts a task, the compactor looks at how busy the host is with other
processes than compaction's own, and waits while that is above ``[compactor]
yield_above_cpu``. The wait is bounded: after ``max_yield_s`` of waiting, compaction goes on
regardless until the host has been seen quiet again, so under a burst the tables fall at most
that much further behind, and under sustained load compaction still keeps up.

The host's CPU is read from Linux's ``/proc``; where there is none, compaction never waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from icefloe import metrics

log = logging.getLogger(__name__)

SAMPLE_S = 1.0
"""The host's CPU is averaged over at least this long: shorter spans see single requests."""
POLL_S = 0.5
"""How often a waiting compaction looks at the host again."""


class HostCpu:
    """The share of a host's CPU that processes other than compaction's used between two
    samples: 0 for an idle host, 1 for every core busy.

    Args:
        excluded_pids: The processes whose CPU is compaction's (worker processes, the
            compactor's own process), asked at each sample as workers come and go.
        proc: Where the kernel's process information is (``/proc``).
    """

    def __init__(self, excluded_pids: Callable[[], Iterable[int]], proc: Path = Path("/proc")):
        self._excluded_pids = excluded_pids
        self._proc = proc
        self._host: tuple[int, int] | None = None
        self._excluded: dict[int, int] = {}

    @classmethod
    def available(cls, proc: Path = Path("/proc")) -> bool:
        return (proc / "stat").is_file()

    def sample(self) -> float | None:
        """The others' share since the previous sample; ``None`` at the first sample, or when
        the kernel's figures cannot be read."""
        host = self._read_host()
        excluded = {pid: ticks for pid in self._excluded_pids() if (ticks := self._ticks(pid))}
        before, before_excluded = self._host, self._excluded
        self._host, self._excluded = host, excluded
        if host is None or before is None:
            return None
        busy, total = host[0] - before[0], host[1] - before[1]
        if total <= 0:
            return None
        # A process that started since the last sample spent all its CPU in between.
        ours = sum(ticks - before_excluded.get(pid, 0) for pid, ticks in excluded.items())
        return min(1.0, max(0.0, (busy - ours) / total))

    def _read_host(self) -> tuple[int, int] | None:
        """(busy, total) clock ticks of all cores since boot, from the ``cpu`` line."""
        try:
            with open(self._proc / "stat", "rb") as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        if len(fields) < 8 or fields[0] != b"cpu":
            return None
        try:
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
        except ValueError:
            return None
        busy = user + nice + system + irq + softirq + steal
        return busy, busy + idle + iowait

    def _ticks(self, pid: int) -> int:
        """User and system clock ticks ``pid`` spent; 0 once it is gone."""
        try:
            data = (self._proc / str(pid) / "stat").read_bytes()
        except OSError:
            return 0
        # The command name in parentheses may hold spaces: fields count from its end.
        fields = data.rpartition(b")")[2].split()
        try:
            return int(fields[11]) + int(fields[12])
        except (IndexError, ValueError):
            return 0


class LoadGate:
    """Whether compaction should wait for a busy host now, and the wait itself.

    Args:
        threshold: Others' share of the host's CPU above which compaction waits; 1 or more
            never waits.
        max_wait_s: How long compaction waits at most before it goes on regardless (until a
            sample sees the host quiet again).
        cpu: The host's CPU, or ``None`` to never wait.
        clock: Monotonic seconds (a parameter for tests).
    """

    def __init__(
        self,
        threshold: float,
        max_wait_s: float,
        cpu: HostCpu | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._threshold = threshold
        self._max_wait_s = max_wait_s
        self._cpu = cpu if threshold < 1 and max_wait_s > 0 else None
        self._clock = clock
        self._load: float | None = None
        self._sampled_at = -SAMPLE_S
        self._busy_since: float | None = None
        self._engaged = 0

    @classmethod
    def for_this_host(cls, threshold: float, max_wait_s: float, *, own_process: bool) -> LoadGate:
        """A gate on this host's CPU, counting this process's child processes (the local
        engine's workers) as compaction's, and this process too if it is the compactor's own
        (not a broker's)."""
        if not HostCpu.available():
            return cls(threshold, max_wait_s, None)
        me = os.getpid()

        def ours() -> list[int]:
            children = [p.pid for p in multiprocessing.active_children() if p.pid is not None]
            return [me, *children] if own_process else children

        return cls(threshold, max_wait_s, HostCpu(ours))

    def holding(self) -> bool:
        """Whether compaction should wait now: :meth:`engaged`, and the host is busy with
        others, and has not been for longer than the longest wait."""
        if self._cpu is None or not self._engaged:
            return False
        now = self._clock()
        if now - self._sampled_at >= SAMPLE_S:
            self._sampled_at = now
            self._load = self._cpu.sample()
        if self._load is None or self._load <= self._threshold:
            if self._busy_since is not None:
                log.debug("host quiet (%.0f%% busy): compaction goes on", 100 * (self._load or 0))
            self._busy_since = None
            metrics.COMPACTION_YIELDING.set(0)
            return False
        if self._busy_since is None:
            log.debug("host %.0f%% busy with clients: compaction waits", 100 * self._load)
            self._busy_since = now
        waiting = now - self._busy_since < self._max_wait_s
        metrics.COMPACTION_YIELDING.set(1 if waiting else 0)
        return waiting

    async def wait(self) -> None:
        """Return once compaction may go on (at once, unless :meth:`holding`)."""
        while self.holding():  # noqa: ASYNC110 - the host's CPU has no event to wait on
            await asyncio.sleep(POLL_S)

    @contextlib.contextmanager
    def engaged(self) -> Iterator[None]:
        """Wait for a busy host only while inside: compaction in the background does, what an
        operator or a test asks for at once does not."""
        self._engaged += 1
        if self._cpu is not None and self._load is None:
            # The first sample only sets the baseline the next one is measured from.
            self._sampled_at = self._clock()
            self._load = self._cpu.sample()
        try:
            yield
        finally:
            self._engaged -= 1
            if not self._engaged:
                metrics.COMPACTION_YIELDING.set(0)
