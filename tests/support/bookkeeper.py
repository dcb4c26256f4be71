"""Apache BookKeeper on free loopback ports, for the BookKeeper WAL plugin's tests.

A cluster is one ZooKeeper and three bookies, each its own JVM from the jars that
`scripts/servers.d/bookkeeper.sh` puts in ``.servers/bookkeeper-<version>/lib``: separate
processes so that a test can kill one bookie (an ensemble change) or pause ZooKeeper (an outage)
while the others go on. :func:`shared_bookkeeper` starts one cluster for the whole test run
(tests isolate themselves by the WAL's ``namespace``); tests that break a server restore it
before they end (``restart_bookie``, ``resume_zookeeper``).
A cluster that cannot start raises: the test errors, it is never skipped.
"""

from __future__ import annotations

import atexit
import shutil
import signal
import socket
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from tests.support.servers import TOOLS, ServerProcess, free_port, free_ports, port_open

VERSION: Final = "4.17.3"
LIB: Final = TOOLS / f"bookkeeper-{VERSION}" / "lib"
"""The jars of ZooKeeper, the bookie and the ledger client (scripts/servers.d/bookkeeper.sh)."""

JVM_FLAGS: Final = (
    "-Xmx192m",
    "-XX:MaxDirectMemorySize=192m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",  # starts faster; these servers are small
    "--add-opens", "java.base/java.nio=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dzookeeper.admin.enableServer=false",
    "-Dzookeeper.4lw.commands.whitelist=stat,dump",
)  # fmt: skip

LOG4J: Final = """\
rootLogger.level = warn
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss.SSS} %-5p %c{1} - %m%n
"""


def classpath() -> str:
    """The class path of the BookKeeper jars, or a clear error naming the install script."""
    if not (LIB / f"bookkeeper-server-{VERSION}.jar").is_file():
        raise RuntimeError(f"BookKeeper {VERSION} is not installed: run scripts/install-servers")
    return str(LIB / "*")


def _java(main: str, *args: str, workdir: Path) -> list[str]:
    return [
        "java",
        *JVM_FLAGS,
        f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}",
        "-cp",
        classpath(),
        main,
        *args,
    ]


def four_letter_word(port: int, word: str) -> str:
    """ZooKeeper's answer to a four-letter command (``stat``, ``dump``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(word.encode())
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


@dataclass
class BookKeeperCluster:
    """A running ZooKeeper and its bookies."""

    workdir: Path
    zk_port: int
    zookeeper: ServerProcess
    bookie_ports: list[int]
    bookies: list[ServerProcess] = field(default_factory=list)

    @property
    def metadata_service_uri(self) -> str:
        return f"zk+hierarchical://127.0.0.1:{self.zk_port}/ledgers"

    def wal_options(self, namespace: str, **extra: Any) -> dict[str, Any]:
        """Options of ``[wal.bookkeeper]`` that reach this cluster."""
        return {
            "metadata_service_uri": self.metadata_service_uri,
            "classpath": str(LIB),
            "namespace": namespace,
            **extra,
        }

    def registered_bookies(self) -> set[int]:
        """Ports of the bookies registered as available in ZooKeeper."""
        dump = four_letter_word(self.zk_port, "dump")
        return {
            port for port in self.bookie_ports if f"/ledgers/available/127.0.0.1:{port}" in dump
        }

    def kill_bookie(self, index: int) -> None:
        """SIGKILL one bookie: no goodbye to ZooKeeper or to clients."""
        process = self.bookies[index].process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def pause_bookie(self, index: int) -> None:
        self.bookies[index].pause()

    def resume_bookie(self, index: int) -> None:
        self.bookies[index].resume()

    def restart_bookie(self, index: int) -> None:
        """Start a stopped bookie again on its port and data, and wait until it registers."""
        old = self.bookies[index]
        self.bookies[index] = self._bookie(index).start()
        del old

    def pause_zookeeper(self) -> None:
        self.zookeeper.pause()

    def resume_zookeeper(self) -> None:
        self.zookeeper.resume()

    def stop(self) -> None:
        for bookie in self.bookies:
            bookie.stop()
        self.zookeeper.stop()

    def discard(self) -> None:
        """Stop every server, then delete the cluster's folder."""
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _bookie(self, index: int) -> ServerProcess:
        port = self.bookie_ports[index]
        folder = self.workdir / f"bookie-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "log4j2.properties").write_text(LOG4J)
        conf = folder / "bookie.conf"
        conf.write_text(
            "\n".join(
                [
                    f"bookiePort={port}",
                    "advertisedAddress=127.0.0.1",
                    "allowLoopback=true",
                    f"journalDirectories={folder / 'journal'}",
                    f"ledgerDirectories={folder / 'ledgers'}",
                    f"metadataServiceUri={self.metadata_service_uri}",
                    "zkTimeout=10000",
                    "httpServerEnabled=false",
                    "ledgerStorageClass=org.apache.bookkeeper.bookie.SortedLedgerStorage",
                    "skipListSizeLimit=16777216",
                    "entryLogFilePreallocationEnabled=false",
                    "journalPreAllocSizeMB=4",
                    "diskUsageThreshold=0.99",
                    "diskUsageWarnThreshold=0.98",
                    "autoRecoveryDaemonEnabled=false",
                    "",
                ]
            )
        )
        argv = _java("org.apache.bookkeeper.server.Main", "--conf", str(conf), workdir=folder)

        def registered() -> bool:
            return port_open(port) and port in self.registered_bookies()

        return ServerProcess(f"bookie-{index}", argv, folder, ready=registered, timeout=90)


def start_bookkeeper(workdir: Path, bookies: int = 3) -> BookKeeperCluster:
    """ZooKeeper, the cluster's metadata, then ``bookies`` bookies (in parallel)."""
    zk_port = free_port()
    zk_dir = workdir / "zookeeper"
    zk_dir.mkdir(parents=True, exist_ok=True)
    (zk_dir / "log4j2.properties").write_text(LOG4J)
    zoo_cfg = zk_dir / "zoo.cfg"
    zoo_cfg.write_text(
        "\n".join(
            [
                "tickTime=1000",
                f"dataDir={zk_dir / 'data'}",
                f"clientPort={zk_port}",
                "clientPortAddress=127.0.0.1",
                "maxClientCnxns=0",
                "minSessionTimeout=2000",
                "maxSessionTimeout=30000",
                "",
            ]
        )
    )
    argv = _java("org.apache.zookeeper.server.ZooKeeperServerMain", str(zoo_cfg), workdir=zk_dir)

    def zk_ready() -> bool:
        return "Mode: standalone" in four_letter_word(zk_port, "stat")

    zookeeper = ServerProcess("zookeeper", argv, zk_dir, ready=zk_ready).start()
    cluster = BookKeeperCluster(workdir, zk_port, zookeeper, free_ports(bookies))
    try:
        _init_cluster(cluster)
        with ThreadPoolExecutor(bookies) as pool:
            cluster.bookies = list(
                pool.map(lambda index: cluster._bookie(index).start(), range(bookies))
            )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _init_cluster(cluster: BookKeeperCluster) -> None:
    """Write the cluster's metadata in ZooKeeper (``bookkeeper shell initnewcluster``)."""
    folder = cluster.workdir / "shell"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "log4j2.properties").write_text(LOG4J)
    conf = folder / "shell.conf"
    conf.write_text(f"metadataServiceUri={cluster.metadata_service_uri}\n")
    argv = _java(
        "org.apache.bookkeeper.bookie.BookieShell", "-conf", str(conf), "initnewcluster",
        workdir=folder,
    )  # fmt: skip
    done = subprocess.run(argv, cwd=folder, capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise RuntimeError(f"BookKeeper initnewcluster failed ({done.returncode}): {output}")


_shared: dict[str, BookKeeperCluster] = {}


def shared_bookkeeper() -> BookKeeperCluster:
    """The BookKeeper cluster shared by this test run, started on first use."""
    cluster = _shared.get("cluster")
    if cluster is None or any(
        p.process is None or p.process.poll() is not None
        for p in (cluster.zookeeper, *cluster.bookies)
    ):
        if cluster is not None:
            cluster.discard()
        workdir = Path(tempfile.mkdtemp(prefix="icefloe-bookkeeper-"))
        cluster = _shared["cluster"] = start_bookkeeper(workdir)
        atexit.register(cluster.discard)
    return cluster
