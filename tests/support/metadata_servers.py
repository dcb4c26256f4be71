"""Oxia and etcd servers on free loopback ports, for the metadata plugins' tests.

One server of each kind is shared by the whole test run (tests isolate themselves by key
namespace): :func:`shared_oxia` and :func:`shared_etcd` start it on first use and it is stopped
when the test process exits. Tests that disturb a server (pause, restart) start their own with
:func:`start_oxia` / :func:`start_etcd`. A server that cannot start raises: the test errors.
"""

from __future__ import annotations

import atexit
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from icefloe.config import Config, load_config
from tests.support.servers import ServerProcess, find_program, free_ports, port_open


@dataclass
class MetadataServer:
    """A running metadata server and the options that reach it."""

    process: ServerProcess
    address: str

    def oxia_options(self, namespace: str, **extra: Any) -> dict[str, Any]:
        return {"addresses": [self.address], "namespace": namespace, **extra}

    def etcd_options(self, namespace: str, **extra: Any) -> dict[str, Any]:
        return {"endpoints": [self.address], "namespace": namespace, **extra}

    def config(self, data_dir: Path, namespace: str) -> Config:
        """A configuration whose metadata store is this server, under ``namespace``."""
        backend = self.process.name
        options = (
            self.etcd_options(namespace) if backend == "etcd" else self.oxia_options(namespace)
        )
        metadata = {"backend": backend, backend: options}
        return load_config(env={}, overrides={"data_dir": str(data_dir), "metadata": metadata})


def start_oxia(workdir: Path) -> MetadataServer:
    """A standalone Oxia (one shard) with its data under ``workdir``."""
    port, metrics = free_ports(2)
    argv = [
        find_program("oxia"),
        "standalone",
        "--public-addr", f"127.0.0.1:{port}",
        "--metrics-addr", f"127.0.0.1:{metrics}",
        "--shards", "1",
        "--data-dir", str(workdir / "db"),
        "--wal-dir", str(workdir / "wal"),
        "--wal-sync-data=false",
    ]  # fmt: skip
    process = ServerProcess("oxia", argv, workdir, ready=lambda: port_open(port)).start()
    return MetadataServer(process, f"127.0.0.1:{port}")


def start_etcd(workdir: Path) -> MetadataServer:
    """A one-member etcd with its data under ``workdir``."""
    port, peer, metrics = free_ports(3)
    client_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer}"
    argv = [
        find_program("etcd"),
        "--name", "t0",
        "--data-dir", str(workdir / "data"),
        "--listen-client-urls", client_url,
        "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"t0={peer_url}",
        "--listen-metrics-urls", f"http://127.0.0.1:{metrics}",
    ]  # fmt: skip

    def healthy() -> bool:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1) as response:
            return b'"true"' in response.read()

    process = ServerProcess("etcd", argv, workdir, ready=healthy).start()
    return MetadataServer(process, f"127.0.0.1:{port}")


_shared: dict[str, MetadataServer] = {}


def _shared_server(name: str, start: Any) -> MetadataServer:
    server = _shared.get(name)
    if (
        server is None
        or server.process.process is None
        or server.process.process.poll() is not None
    ):
        workdir = Path(tempfile.mkdtemp(prefix=f"icefloe-{name}-"))
        server = _shared[name] = start(workdir)
        atexit.register(server.process.discard)
    return server


def shared_oxia() -> MetadataServer:
    """The Oxia server shared by this test run, started on first use."""
    return _shared_server("oxia", start_oxia)


def shared_etcd() -> MetadataServer:
    """The etcd server shared by this test run, started on first use."""
    return _shared_server("etcd", start_etcd)
