"""A PostgreSQL server for the Iceberg SQL catalog tests, one per test process.

Debian's binaries, a data folder of its own, a free loopback port, no password (trust on
loopback only). PostgreSQL refuses to run as root, so under root it runs as the ``postgres``
user the package creates.
"""

from __future__ import annotations

import atexit
import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import ServerProcess, free_port, port_open

USER = "icefloe"


@dataclass(frozen=True)
class Postgres:
    port: int
    process: ServerProcess

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{self.port}/postgres"


def _bindir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run scripts/install-servers")
    return found[-1].parent


def _as_server_user(argv: list[str], workdir: Path) -> list[str]:
    """``argv`` run as ``postgres`` when we are root (setpriv execs: signals reach it)."""
    if os.geteuid() != 0:
        return argv
    account = pwd.getpwnam("postgres")
    shutil.chown(workdir, account.pw_uid, account.pw_gid)
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]


@functools.cache
def postgres() -> Postgres:
    bindir = _bindir()
    workdir = Path(tempfile.mkdtemp(prefix="icefloe-postgres-"))
    data = workdir / "data"
    initdb = [str(bindir / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "--no-sync"]
    subprocess.run(_as_server_user(initdb, workdir), check=True, capture_output=True, cwd=workdir)
    port = free_port()
    argv = [
        str(bindir / "postgres"),
        *("-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", str(workdir)),
        *("-c", "fsync=off", "-c", "max_connections=200"),
    ]
    process = ServerProcess(
        "postgres",
        _as_server_user(argv, workdir),
        workdir,
        ready=lambda: port_open(port),
        timeout=60.0,
    )
    process.start()
    atexit.register(process.discard)
    return Postgres(port, process)
