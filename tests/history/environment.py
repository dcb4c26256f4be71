"""What a history run sets up around its brokers for the faults it was asked for: the metadata
store (and the proxy or cluster its faults need), the object store behind its fault proxy, the
skewable clocks, the small disk. :func:`environment` starts them and stops them after the run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from tests.chaos.runs import STORES, store_settings
from tests.history.nemesis import Targets
from tests.history.objects import FaultyObjectStore
from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.etcd_cluster import EtcdCluster
from tests.support.fault_proxy import ProxyThread
from tests.support.sockets import socket_holder
from tests.support.tcp_proxy import TcpFaultProxy

OBJECT_STORE_SETTINGS: Final = {
    # Orphaned WAL objects (an upload-crash leaves one) swept within the run, so that listings
    # (stale ones too) happen: ten seconds to commit an object, forty before a sweep may take
    # it, wider apart than the longest pause between the two.
    "ICEFLOE_STORAGE__COMMIT_DEADLINE_S": "10",
    "ICEFLOE_STORAGE__ORPHAN_GRACE_S": "40",
}
SKEWED_CLOCK: Final = Path(__file__).parents[1] / "support" / "skewed_clock"
"""On the brokers' ``PYTHONPATH`` for clock-skew faults: its sitecustomize shifts their clocks."""
DISK_MB: Final = 2048
"""The brokers' own disk for disk-full faults: room for a run's WAL, metadata and scratch."""
STORE_CHOICES: Final = ("sqlite", *STORES, "etcd3")
OBJECT_CHOICES: Final = ("local", "minio")


class BrokerOwners:
    """Which broker holds the client end of a loopback connection from a port (once the
    cluster runs): how the proxies tell brokers apart."""

    running: RunningIcefloe | None = None

    def __call__(self, port: int) -> int | None:
        if self.running is None:
            return None
        found = socket_holder(port, broker_pids(self.running))
        return None if found is None else found[0]


@dataclass
class Environment:
    """See the module docstring; :meth:`start_brokers` starts the cluster in it."""

    servers: contextlib.ExitStack
    """Stops what was started, last first."""
    settings: dict[str, str]
    """The ``ICEFLOE_…`` (and other) environment of ``serve``."""
    data: Path
    """The brokers' data folder."""
    reader_settings: dict[str, str] = field(default_factory=dict)
    """The same, but straight to the stores rather than through their fault proxies: for
    what the run itself reads (``icefloe tables`` in this process, whose native code may hold
    the GIL the in-process proxy needs)."""
    owners: BrokerOwners = field(default_factory=BrokerOwners)
    readers: tuple[dict[str, str], dict[str, str]] = ({}, {})
    """What engines reading the tables need (Delta's storage options, pyiceberg's properties)."""
    targets: Targets = field(default_factory=Targets)
    """What the faults act on beside the brokers."""

    def start_brokers(self, count: int) -> RunningIcefloe:
        """``serve`` with ``count`` brokers in this environment, stopped with it."""
        running = start_icefloe(self.data, brokers=count, env=self.settings)
        self.servers.callback(running.stop)
        self.owners.running = running
        return running


@contextlib.contextmanager
def environment(
    folder: Path, settings: dict[str, str], faults: list[str], seed: int, store: str, objects: str
) -> Iterator[Environment]:
    """The environment of a run in ``folder`` (``settings`` added to its own)."""
    with contextlib.ExitStack() as servers:
        env = Environment(servers, dict(settings), folder / "data")
        direct = _metadata_store(env, folder, store)
        env.reader_settings = env.settings | direct
        if objects == "minio":
            env.targets.objects = FaultyObjectStore(folder / "minio", seed, env.owners)
            servers.callback(env.targets.objects.close)
            env.settings |= OBJECT_STORE_SETTINGS | env.targets.objects.settings()
            env.reader_settings |= OBJECT_STORE_SETTINGS | env.targets.objects.settings(direct=True)
            env.readers = env.targets.objects.readers()
        if "clock-skew" in faults:
            env.targets.clocks = folder / "clocks"
            env.targets.clocks.mkdir(exist_ok=True)
            env.settings |= {
                "SKEWED_CLOCK_DIR": str(env.targets.clocks),
                "PYTHONPATH": str(SKEWED_CLOCK),
            }
        if "disk-full" in faults:
            # The data folder is the small disk itself: serve's log, beside it, stays on the
            # run's own disk, where it can be written while the small one is full.
            env.targets.disk = env.data
            _mount_small_disk(env.targets.disk)
            servers.callback(_unmount, env.targets.disk, folder / "data-after-the-run")
        yield env


def _metadata_store(env: Environment, folder: Path, store: str) -> dict[str, str]:
    """Start the metadata store the run asked for; the settings that reach it directly (the
    brokers' may go through a proxy)."""
    servers = env.servers
    if store == "sqlite":
        return {}
    if store == "etcd3":
        env.targets.etcd = EtcdCluster(folder / "etcd3")
        servers.callback(env.targets.etcd.stop)
        env.settings |= {
            "ICEFLOE_METADATA__BACKEND": "etcd",
            "ICEFLOE_METADATA__ETCD__ENDPOINTS": json.dumps(env.targets.etcd.endpoints),
        }
        return {}
    server = STORES[store](folder / store)
    servers.callback(server.process.stop)
    env.targets.store = server.process
    direct = store_settings(store, server)
    env.settings |= direct
    if store == "etcd":
        # Oxia hands its clients the server's own address for each shard: a proxy in front
        # of it would not be in their path.
        port = int(server.address.rsplit(":", 1)[1])
        env.targets.store_proxy = ProxyThread(TcpFaultProxy(port, env.owners))
        servers.callback(env.targets.store_proxy.close)
        proxied = dataclasses.replace(server, address=env.targets.store_proxy.proxy.address)
        env.settings |= store_settings(store, proxied)
    return direct


def _mount_small_disk(folder: Path) -> None:
    """A tmpfs of ``DISK_MB`` at ``folder``, for the disk-full fault (needs root)."""
    folder.mkdir(exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        raise RuntimeError(
            f"disk-full needs a disk of its own: mounting a tmpfs at {folder} failed "
            f"({mounted.stderr.strip()}); run as root, or leave disk-full out of --faults"
        )


def _unmount(folder: Path, keep: Path) -> None:
    """Unmount the small disk at ``folder``, its contents copied to ``keep`` first (what is
    left to look at once a run is over)."""
    shutil.copytree(folder, keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("ballast"))
    subprocess.run(["umount", str(folder)], check=False)
