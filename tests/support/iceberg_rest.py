"""The Iceberg REST catalog fixture server, one per test process.

`scripts/servers.d/iceberg-rest.sh` installs the runnable jar; :func:`iceberg_rest` starts it
on a free port the first time a test asks and stops it when the process exits. The server
keeps its catalog in a SQLite file (over JDBC) and writes table metadata itself, through its
own file IO, to the table's ``write.metadata.path`` — so it must see the same filesystem as
the tests, which is why it runs here rather than in a sandbox.

Caveat: the fixture binds all interfaces (it has no option for the address). That is
acceptable only because tests talk to it on 127.0.0.1 and the machine has no other network.
A server that cannot start raises, so the tests that need it *error*, never skip.
"""

from __future__ import annotations

import atexit
import functools
import json
import shutil
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tests.support.servers import TOOLS, ServerProcess, free_port, port_open

VERSION: Final = "1.10.1"
JAR: Final = TOOLS / "iceberg-rest" / f"iceberg-open-api-{VERSION}.jar"


@dataclass(frozen=True)
class IcebergRest:
    port: int
    process: ServerProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _answers_config(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/v1/config", timeout=1) as response:
        return "defaults" in json.load(response)


@functools.cache
def iceberg_rest() -> IcebergRest:
    """The running fixture server (started on first use)."""
    java = shutil.which("java")
    if java is None or not JAR.exists():
        raise RuntimeError(
            f"the Iceberg REST fixture is not installed ({JAR}, java): run scripts/install-servers"
        )
    workdir = Path(tempfile.mkdtemp(prefix="icefloe-iceberg-rest-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = ServerProcess(
        "iceberg-rest",
        [java, "-Xmx512m", "-jar", str(JAR)],
        workdir,
        ready=lambda: port_open(port) and _answers_config(url),
        env={
            "CATALOG_URI": f"jdbc:sqlite:{workdir / 'catalog.db'}",
            "CATALOG_JDBC_USER": "user",
            "CATALOG_JDBC_PASSWORD": "password",
            "CATALOG_WAREHOUSE": (workdir / "warehouse").as_uri(),
            "CATALOG_REST_PORT": str(port),
        },
        timeout=90.0,
    )
    process.start()
    atexit.register(process.stop)
    return IcebergRest(port, process)
