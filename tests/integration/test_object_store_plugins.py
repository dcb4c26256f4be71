"""The S3, GCS and Azure plugins beyond the port contract: registration, configuration from
the SDKs' usual environment variables, clear errors, and large create-if-absent writes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from icefloe.config import load_config, masked
from icefloe.errors import AlreadyExistsError, StorageError
from icefloe.plugins import BackendRegistry
from icefloe.ports.base import PortKind
from icefloe.ports.object_store import ObjectStore
from icefloe.testing.contract import Contract, open_backend
from icefloe.testing.object_store_contract import chunks_of
from tests.support.object_servers import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    BUCKET,
    MOTO_CREDENTIALS,
    OPTIONS,
    azurite,
    azurite_connection_string,
    fake_gcs,
    moto,
)

PLUGINS = {
    "s3": ("icefloe-store-s3", "S3ObjectStore", "boto3"),
    "gcs": ("icefloe-store-gcs", "GCSObjectStore", "google.cloud.storage"),
    "azure": ("icefloe-store-azure", "AzureObjectStore", "azure.storage.blob"),
}


SMALLEST_PART = {"s3": 5 << 20, "gcs": 256 << 10, "azure": 256 << 10}


async def open_store(name: str, tmp_path: Path, options: dict[str, Any]) -> ObjectStore:
    store = await open_backend(PortKind.OBJECT_STORE, name, tmp_path, options)
    assert isinstance(store, ObjectStore)
    return store


# --- registration and configuration ---------------------------------------------------------


@pytest.mark.parametrize("name", PLUGINS)
def test_plugin_registers_its_backend_under_its_distribution(name: str) -> None:
    distribution, cls_name, _ = PLUGINS[name]
    backend = BackendRegistry().get(PortKind.OBJECT_STORE, name)
    assert backend.distribution == distribution
    assert backend.load().__name__ == cls_name


@pytest.mark.parametrize("name", PLUGINS)
def test_listing_and_resolving_the_backend_imports_no_sdk(name: str) -> None:
    _, _, sdk = PLUGINS[name]
    required = {"s3": "bucket", "gcs": "bucket", "azure": "container"}[name]
    script = (
        "import sys\n"
        "from icefloe.config import load_config, resolve_one\n"
        "from icefloe.ports import ObjectStore\n"
        "from icefloe.plugins import BackendRegistry\n"
        "from icefloe.ports.base import PortKind\n"
        "BackendRegistry().installed()\n"
        f"config = load_config(env={{}}, overrides={{'object_store': {{'backend': {name!r}, "
        f"{name!r}: {{{required!r}: 'some-bucket'}}}}}})\n"
        "resolve_one(config, ObjectStore)\n"
        f"assert {sdk!r} not in sys.modules, 'the SDK was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_credentials_are_masked_in_the_shown_configuration() -> None:
    config = load_config(
        env={},
        overrides={
            "object_store": {
                "backend": "azure",
                "azure": {"container": "icefloe", "account_url": "https://a", "account_key": "k3y"},
            }
        },
    )
    shown = masked(config)["object_store"]["azure"]
    assert shown["account_key"] != "k3y"
    assert "k3y" not in repr(shown)


def test_s3_access_key_without_secret_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="secret_access_key"):
        asyncio.run(open_store("s3", tmp_path, {"bucket": BUCKET, "access_key_id": "only-half"}))


# --- the SDKs' usual environment variables --------------------------------------------------


@pytest.mark.asyncio
async def test_s3_reads_endpoint_and_credentials_from_aws_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto().url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", MOTO_CREDENTIALS["access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MOTO_CREDENTIALS["secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    options = {"bucket": BUCKET, "prefix": Contract.new_unique(), "addressing_style": "path"}
    store = await open_store("s3", tmp_path, options)
    try:
        await store.put("from-env", b"x")
        assert await store.get("from-env") == b"x"
    finally:
        await store.close()


@pytest.mark.asyncio
async def test_gcs_reads_the_emulator_from_storage_emulator_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs().url)
    store = await open_store("gcs", tmp_path, {"bucket": BUCKET, "prefix": Contract.new_unique()})
    try:
        await store.put("from-env", b"x")
        assert await store.get("from-env") == b"x"
    finally:
        await store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("variables", ["connection-string", "account-and-key"])
async def test_azure_reads_credentials_from_azure_storage_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variables: str
) -> None:
    options: dict[str, Any] = {"container": BUCKET, "prefix": Contract.new_unique()}
    if variables == "connection-string":
        monkeypatch.setenv(
            "AZURE_STORAGE_CONNECTION_STRING", azurite_connection_string(azurite().url)
        )
    else:
        monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT)
        monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)
        options["account_url"] = f"{azurite().url}/{AZURITE_ACCOUNT}"
    store = await open_store("azure", tmp_path, options)
    try:
        await store.put("from-env", b"x")
        assert await store.get("from-env") == b"x"
    finally:
        await store.close()


# --- clear errors ---------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("name", PLUGINS)
async def test_a_missing_bucket_fails_at_open_and_names_it(name: str, tmp_path: Path) -> None:
    options = OPTIONS[name]("p")
    options["container" if name == "azure" else "bucket"] = "no-such-bucket"
    with pytest.raises(StorageError, match="no-such-bucket") as raised:
        await open_store(name, tmp_path, options)
    assert raised.value.__cause__ is not None


# --- large create-if-absent writes ----------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("name", PLUGINS)
async def test_large_stream_if_absent_on_an_existing_key_keeps_the_old_bytes(
    name: str, tmp_path: Path
) -> None:
    part = SMALLEST_PART[name]
    store = await open_store(name, tmp_path, OPTIONS[name](Contract.new_unique(), part_size=part))
    try:
        await store.put("object", b"old")
        with pytest.raises(AlreadyExistsError):
            await store.put_stream("object", chunks_of([b"n" * part] * 3), if_absent=True)
        assert await store.get("object") == b"old"
    finally:
        await store.close()


async def race_large_streams(name: str, tmp_path: Path, writers: int) -> list[object]:
    part = SMALLEST_PART[name]
    store = await open_store(name, tmp_path, OPTIONS[name](Contract.new_unique(), part_size=part))
    try:
        parts = [[bytes([w]) * part] * 3 for w in range(writers)]
        return await asyncio.gather(
            *(store.put_stream("race", chunks_of(p), if_absent=True) for p in parts),
            return_exceptions=True,
        )
    finally:
        await store.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            "s3",
            marks=pytest.mark.xfail(
                reason="moto checks If-None-Match on CompleteMultipartUpload without a lock, "
                "so concurrent completions may all win (real S3 serialises them); not strict "
                "because the race is sometimes won fairly",
                strict=False,
            ),
        ),
        pytest.param(
            "gcs",
            marks=pytest.mark.xfail(
                reason="fake-gcs-server enforces ifGenerationMatch=0 only on one-shot "
                "uploads, not when a resumable session is finalised (real GCS does)",
                strict=True,
            ),
        ),
        "azure",
    ],
)
async def test_large_streams_racing_for_one_key_have_exactly_one_winner(
    name: str, tmp_path: Path
) -> None:
    outcomes = await race_large_streams(name, tmp_path, writers=4)
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(winners) == 1, outcomes
    assert all(isinstance(o, AlreadyExistsError) for o in outcomes if o not in winners)
