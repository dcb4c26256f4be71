"""The Iceberg REST catalog fixture server: one on the local filesystem, one on MinIO (S3), each
started once per test process.

`scripts/servers.d/iceberg-rest.sh` installs the runnable jar; :func:`iceberg_rest` starts it
on a free port the first time a test asks and stops it when the process exits. The server
keeps its catalog in a SQLite file (over JDBC) and writes table metadata itself, through its
own file IO, to the table's ``write.metadata.path`` — so it must see the same filesystem as
the tests, which is why it runs here rather than in a sandbox. :func:`iceberg_rest_on_minio`
gives it Iceberg's S3 file IO and the MinIO test server instead.

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

from tests.support.object_servers import BUCKET, MINIO_CREDENTIALS, minio
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
    """The fixture server on the local filesystem (started on first use)."""
    return _start({})


@functools.cache
def iceberg_rest_on_minio() -> IcebergRest:
    """The fixture server writing metadata to the MinIO test server (started on first use)."""
    server = minio()
    return _start(
        {
            "CATALOG_WAREHOUSE": f"s3://{BUCKET}/iceberg-rest-warehouse",
            "CATALOG_IO__IMPL": "org.apache.iceberg.aws.s3.S3FileIO",
            "CATALOG_S3_ENDPOINT": server.url,
            "CATALOG_S3_PATH__STYLE__ACCESS": "true",
            "CATALOG_S3_ACCESS__KEY__ID": MINIO_CREDENTIALS["access_key_id"],
            "CATALOG_S3_SECRET__ACCESS__KEY": MINIO_CREDENTIALS["secret_access_key"],
            "CATALOG_CLIENT_REGION": "us-east-1",
        }
    )


def _start(env: dict[str, str]) -> IcebergRest:
    """The fixture server with catalog properties ``env`` over the local-filesystem defaults
    (``CATALOG_A_B__C`` is the property ``a.b-c``)."""
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
            **env,
        },
        timeout=90.0,
    )
    process.start()
    atexit.register(process.discard)
    return IcebergRest(port, process)
