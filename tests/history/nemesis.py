"""Faults scheduled during a history run, each checked to have happened and noted with its
start and end (seconds on the history's clock), so the report can say what clients saw
during each one.

- ``kill``: SIGKILL one of ``serve``'s brokers at random (``serve`` starts it again).
- ``pause``: SIGSTOP one broker for longer than its metadata-store session and producer leases,
  then SIGCONT: it wakes up believing it still owns what others have taken over meanwhile.
- ``store-kill``: SIGKILL the metadata server (etcd, Oxia), start it again on its data after a
  few seconds.
- ``store-pause``: SIGSTOP the metadata server past every session's TTL, then SIGCONT.
- ``disk-full``: fill the disk under the brokers' data folder (their WAL, the embedded metadata
  store, the compactor's scratch space: a tmpfs of the run's own) for 10–15 s, then free it;
- ``clock-skew``: step one broker's wall clock minutes ahead, then as far behind, then back
  (:mod:`tests.support.skewed_clock.sitecustomize`);
- ``leader-kill``: SIGKILL the leader of a three-member etcd cluster (``--store etcd3``), start it
  again on its data after a few seconds;
- ``leader-partition``: cut the etcd leader off the other two members (clients still reach it)
  for as long as a pause;
- ``store-partition``: cut one broker off the metadata server (etcd, reached through a TCP
  proxy) past its session's TTL, the others unaffected; clients still reach that broker.

With the object store on a MinIO of the run's own behind a fault proxy
(:mod:`tests.history.objects`):

- ``objects-kill``: SIGKILL MinIO, start it again on its data after a few seconds;
- ``objects-503``: for seconds, half the object-store requests answered 503 SlowDown;
- ``objects-slow``: for seconds, every object-store request held seconds before it is
  forwarded (a latency spike);
- ``objects-stale-list``: for a while, listings answered as they were before it began;
- ``upload-crash``: SIGKILL the broker (or compactor) that made the next upload, once MinIO has
  applied it and before the uploader hears so: between an object's upload and its commit;
- ``objects-partition``: cut one broker off the object store for as long as a pause.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.history.objects import FaultyObjectStore
from tests.history.recorder import History
from tests.support.broker import RunningIcefloe, broker_pids
from tests.support.chaos import process_gone, process_stopped
from tests.support.etcd_cluster import EtcdCluster
from tests.support.fault_proxy import ProxyThread
from tests.support.servers import ServerProcess
from tests.support.tcp_proxy import TcpFaultProxy

STORE_KINDS: Final = ("store-kill", "store-pause", "store-partition")
CLUSTER_KINDS: Final = ("leader-kill", "leader-partition")
OBJECT_KINDS: Final = (
    "objects-kill",
    "objects-503",
    "objects-slow",
    "objects-stale-list",
    "upload-crash",
    "objects-partition",
)
KINDS: Final = (
    "kill",
    "pause",
    "clock-skew",
    "disk-full",
    *STORE_KINDS,
    *CLUSTER_KINDS,
    *OBJECT_KINDS,
)
EVERY_S: Final = (8.0, 14.0)
"""Seconds between the end of one fault and the start of the next (a range)."""
PAUSE_S: Final = (12.0, 18.0)
"""How long a paused process stays stopped: past the session TTL the runs configure."""
KILLED_WITHIN_S: Final = 120.0
"""How long a SIGKILLed server may take to die (MinIO waits out a disk write first)."""
STORE_DOWN_S: Final = 3.0
"""How long a killed metadata server (or MinIO) stays down."""
OBJECT_FAULT_S: Final = (5.0, 10.0)
"""How long a storm of 503s or a latency spike lasts."""
LATENCY_S: Final = (2.0, 4.0)
"""How long each object-store request is held during a latency spike."""
STALE_LISTS_S: Final = (10.0, 20.0)
DISK_FULL_S: Final = (10.0, 15.0)
SKEW_S: Final = (60.0, 300.0)
"""How far a skewed clock is stepped (ahead, then behind)."""
SKEWED_FOR_S: Final = (10.0, 15.0)
"""How long a clock stays stepped each way."""


def _fill_up(ballast: Path) -> None:
    """Take every free block of ``ballast``'s disk (the brokers write meanwhile: what they
    take is taken too)."""
    with ballast.open("wb", buffering=0) as file:
        for _ in range(10):
            stats = os.statvfs(ballast.parent)
            free = stats.f_bavail * stats.f_frsize
            if free == 0:
                return
            try:
                os.posix_fallocate(file.fileno(), file.seek(0, os.SEEK_END), free)
            except OSError:
                continue  # less free than a moment ago
        with contextlib.suppress(OSError):  # the last blocks, until the disk refuses
            while True:
                file.write(b"\0" * 4096)


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    target: str
    began: float
    ended: float

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "target": self.target, "began": self.began, "ended": self.ended}


@dataclass
class Targets:
    """What a run set up for faults beyond its brokers (each ``None`` unless asked for)."""

    store: ServerProcess | None = None
    """The metadata server, for ``store-kill`` and ``store-pause``."""
    store_proxy: ProxyThread[TcpFaultProxy] | None = None
    """The TCP proxy between the brokers and the metadata server, for ``store-partition``."""
    etcd: EtcdCluster | None = None
    """The three-member etcd cluster, for ``leader-*``."""
    objects: FaultyObjectStore | None = None
    """MinIO behind its fault proxy, for ``objects-*`` and ``upload-crash``."""
    clocks: Path | None = None
    """The brokers' ``SKEWED_CLOCK_DIR``, for ``clock-skew``."""
    disk: Path | None = None
    """A folder on the brokers' own small disk, for ``disk-full``."""


NEEDS: Final = {
    ("store-kill", "store-pause"): ("store", "a metadata server (--store etcd|oxia)"),
    ("store-partition",): ("store_proxy", "the metadata store on one etcd (--store etcd)"),
    CLUSTER_KINDS: ("etcd", "a three-member etcd (--store etcd3)"),
    OBJECT_KINDS: ("objects", "the object store on MinIO (--objects minio)"),
    ("clock-skew",): ("clocks", "brokers started with a skewable clock"),
    ("disk-full",): ("disk", "the brokers' data on a disk of their own"),
}
"""What each fault kind needs of :class:`Targets`, and how to have it."""


class Nemesis(threading.Thread):
    """Injects the given kinds of faults in turn, at random times, until stopped."""

    def __init__(
        self,
        running: RunningIcefloe,
        targets: Targets,
        kinds: list[str],
        history: History,
        seed: int,
    ) -> None:
        super().__init__(name="nemesis", daemon=True)
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
        for needing, (attribute, how) in NEEDS.items():
            asked = sorted(set(kinds) & set(needing))
            if asked and getattr(targets, attribute) is None:
                raise ValueError(f"{', '.join(asked)} faults need {how}")
        self._running = running
        self._targets = targets
        self._kinds = kinds
        self._history = history
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self.faults: list[Fault] = []
        self.failures: list[str] = []
        """Faults that did not happen as they should (a run whose faults did not happen
        proves nothing)."""

    def run(self) -> None:
        n = 0
        while not self._stopping.wait(self._random.uniform(*EVERY_S)):
            kind = self._kinds[n % len(self._kinds)]
            began = self._history.now()
            pids = broker_pids(self._running)
            if not pids:
                continue  # serve is starting them again
            try:
                target = self._inject(kind, self._random.choice(pids))
            except Exception as exc:  # noqa: BLE001 - a fault gone wrong fails the run, not this thread
                self.failures.append(f"{kind} at {began:.1f} s: {exc!r}")
                target = "failed"
            self.faults.append(Fault(kind, target, began, self._history.now()))
            n += 1

    def _inject(self, kind: str, pid: int) -> str:
        """Inject one fault of ``kind`` (at broker ``pid`` if it hits one broker) and wait it
        out; what it hit."""
        targets = self._targets
        if kind == "kill":
            self._kill(pid)
        elif kind == "pause":
            self._pause(pid)
        elif kind == "clock-skew":
            assert targets.clocks is not None
            self._skew(pid, targets.clocks)
        elif kind == "disk-full":
            assert targets.disk is not None
            self._fill(targets.disk)
            return "data disk"
        elif kind in ("store-kill", "store-pause"):
            assert targets.store is not None
            self._fault_process(kind, targets.store)
            return targets.store.name
        elif kind == "store-partition":
            assert targets.store_proxy is not None
            self._partition_from_store(pid, targets.store_proxy)
            return f"broker {pid} | metadata store"
        elif kind in CLUSTER_KINDS:
            assert targets.etcd is not None
            return self._leader_fault(kind, targets.etcd)
        elif kind == "objects-partition":
            assert targets.objects is not None
            self._partition_from_objects(pid, targets.objects)
            return f"broker {pid} | object store"
        else:
            assert targets.objects is not None
            return self._object_fault(kind, targets.objects)
        return f"broker {pid}"

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not process_gone(pid, 10.0):
            self.failures.append(f"broker {pid} was still alive 10 s after SIGKILL")

    def _pause(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        if not process_stopped(pid):
            self.failures.append(f"broker {pid} did not stop on SIGSTOP")
        # Sleep through the pause even when asked to stop: a broker left stopped would hang
        # the run's end.
        time.sleep(self._random.uniform(*PAUSE_S))
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            self.failures.append(f"broker {pid} died while paused")

    def _fault_process(self, kind: str, server: ServerProcess) -> None:
        """Kill (``*-kill``) or pause a server process, then bring it back."""
        process = server.process
        assert process is not None
        if kind.endswith("-kill"):
            server.kill(within=KILLED_WITHIN_S)
            time.sleep(STORE_DOWN_S)
            server.start()
        else:
            server.pause()
            if not process_stopped(process.pid):
                self.failures.append(f"{server.name} did not stop on SIGSTOP")
            time.sleep(self._random.uniform(*PAUSE_S))
            server.resume()

    def _leader_fault(self, kind: str, etcd: EtcdCluster) -> str:
        deadline = time.monotonic() + 10
        while (leader := etcd.leader()) is None:
            if time.monotonic() > deadline:
                self.failures.append("the etcd cluster had no leader to fault for 10 s")
                return "nothing"
            time.sleep(0.2)
        if kind == "leader-kill":
            etcd.kill(leader)
            time.sleep(STORE_DOWN_S)
            etcd.restart(leader)
        else:
            etcd.cut_off(leader)
            time.sleep(self._random.uniform(*PAUSE_S))
            if etcd.heal() == 0:
                self.failures.append(f"etcd member {leader} had no peer connection to cut")
        return f"etcd leader m{leader}"

    def _fill(self, disk: Path) -> None:
        ballast = disk / "ballast"
        _fill_up(ballast)
        left = os.statvfs(disk)
        if left.f_bavail * left.f_frsize > 1 << 20:
            self.failures.append(f"the data disk still had {left.f_bavail} blocks free")
        time.sleep(self._random.uniform(*DISK_FULL_S))
        ballast.unlink()

    def _skew(self, pid: int, clocks: Path) -> None:
        shift = self._random.uniform(*SKEW_S)
        clock, seen = clocks / str(pid), clocks / f"{pid}.seen"
        seen.unlink(missing_ok=True)  # what an earlier skew of this broker's clock left
        for step in (shift, -shift):
            clock.write_text(f"{step}\n")
            time.sleep(self._random.uniform(*SKEWED_FOR_S))
        clock.unlink()
        try:
            stepped = [float(line) for line in seen.read_text().split()]
        except FileNotFoundError:
            stepped = []
        if stepped != [shift, -shift] and os.path.exists(f"/proc/{pid}"):
            self.failures.append(f"broker {pid}'s clock was stepped {stepped}, not ±{shift}")

    def _partition_from_store(self, pid: int, proxy: ProxyThread[TcpFaultProxy]) -> None:
        before = proxy.call(lambda: proxy.proxy.cut_connections)
        proxy.call(proxy.proxy.cut_off, {pid})
        time.sleep(self._random.uniform(*PAUSE_S))
        proxy.call(proxy.proxy.heal)
        if proxy.call(lambda: proxy.proxy.cut_connections) == before:
            self.failures.append(f"broker {pid} had no connection to the metadata store to cut")

    def _partition_from_objects(self, pid: int, objects: FaultyObjectStore) -> None:
        before = objects.cut_requests()
        objects.cut_off(pid)
        time.sleep(self._random.uniform(*PAUSE_S))
        objects.heal()
        if objects.cut_requests() == before:
            self.failures.append(f"broker {pid} made no object-store request while cut off")

    def _object_fault(self, kind: str, objects: FaultyObjectStore) -> str:
        """Inject one object-store fault and wait it out; what it hit."""
        if kind == "objects-kill":
            self._fault_process(kind, objects.minio.process)
            return "minio"
        if kind == "upload-crash":
            done = objects.kill_next_uploader(broker_pids(self._running))
            if not done.wait(10.0):
                objects.heal()
                self.failures.append("no upload within 10 s to crash its uploader after")
                return "nothing"
            if objects.killed is None:
                self.failures.append("the process behind an upload was not found to kill")
                return "nothing"
            return f"uploader {objects.killed}"
        if kind == "objects-503":
            seconds = self._random.uniform(*OBJECT_FAULT_S)
            objects.storm(seconds)
        elif kind == "objects-slow":
            seconds = self._random.uniform(*OBJECT_FAULT_S)
            objects.slow(seconds, self._random.uniform(*LATENCY_S))
        else:
            seconds = self._random.uniform(*STALE_LISTS_S)
            objects.stale_lists(seconds)
        time.sleep(seconds)
        return "minio"

    def stop(self) -> None:
        self._stopping.set()
        self.join()
