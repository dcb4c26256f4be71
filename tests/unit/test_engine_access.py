"""What each object-store plugin hands table engines, built from its own configuration: the
rules that pick endpoint, credentials and addressing (the engines' real use of them is tested
against the servers in tests/contract/test_tables_on_object_stores.py)."""

from __future__ import annotations

import json

import pytest
from icefloe_store_azure.engines import AzureAccess
from icefloe_store_gcs.engines import resolve_access as resolve_gcs
from icefloe_store_gcs.options import GCSObjectStoreOptions
from icefloe_store_s3.client import make_client
from icefloe_store_s3.options import S3ObjectStoreOptions

AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
)


@pytest.fixture
def no_aws_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def s3_access(**options: object):  # type: ignore[no-untyped-def]
    client, access = make_client(
        S3ObjectStoreOptions.model_validate({"bucket": "bucket", **options})
    )
    client.close()
    return access


@pytest.mark.usefixtures("no_aws_environment")
def test_s3_configured_keys_and_endpoint_reach_both_engines() -> None:
    access = s3_access(
        endpoint_url="http://127.0.0.1:9000",
        region="eu-west-1",
        access_key_id="id",
        secret_access_key="secret",
        addressing_style="path",
    )
    assert access.object_store_options() == {
        "aws_endpoint": "http://127.0.0.1:9000",
        "aws_region": "eu-west-1",
        "aws_access_key_id": "id",
        "aws_secret_access_key": "secret",
        "aws_conditional_put": "etag",
        "aws_allow_http": "true",
        "aws_virtual_hosted_style_request": "false",
    }
    assert access.iceberg_properties() == {
        "s3.endpoint": "http://127.0.0.1:9000",
        "s3.region": "eu-west-1",
        "client.region": "eu-west-1",
        "s3.access-key-id": "id",
        "s3.secret-access-key": "secret",
        "s3.force-virtual-addressing": "false",
        "s3.path-style-access": "true",
    }


@pytest.mark.usefixtures("no_aws_environment")
def test_s3_keys_from_the_environment_are_handed_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.com")
    options = s3_access(region="us-east-1").object_store_options()
    assert options["aws_access_key_id"] == "env-id"
    assert options["aws_secret_access_key"] == "env-secret"
    assert options["aws_endpoint"] == "https://s3.example.com"
    assert "aws_allow_http" not in options


@pytest.mark.usefixtures("no_aws_environment")
def test_s3_without_static_credentials_leaves_engines_to_their_own_chain() -> None:
    access = s3_access(region="us-east-1")
    assert "aws_access_key_id" not in access.object_store_options()
    assert "s3.access-key-id" not in access.iceberg_properties()
    assert access.object_store_options()["aws_region"] == "us-east-1"


def test_azure_emulator_is_reached_by_its_endpoint() -> None:
    access = AzureAccess(
        "devstoreaccount1", "key", None, "http", "127.0.0.1:10000/devstoreaccount1"
    )
    assert access.object_store_options() == {
        "azure_storage_account_name": "devstoreaccount1",
        "azure_storage_account_key": "key",
        "azure_endpoint": "http://127.0.0.1:10000/devstoreaccount1",
        "azure_allow_http": "true",
    }
    properties = access.iceberg_properties()
    assert properties["adls.blob-storage-authority"] == "127.0.0.1:10000"
    assert properties["adls.blob-storage-scheme"] == "http"


def test_azure_public_cloud_needs_no_endpoint_and_sovereign_clouds_keep_subdomains() -> None:
    public = AzureAccess("acct", None, "sv=1&sig=x", "https", "acct.blob.core.windows.net")
    assert public.object_store_options() == {
        "azure_storage_account_name": "acct",
        "azure_storage_sas_key": "sv=1&sig=x",
    }
    assert "adls.blob-storage-authority" not in public.iceberg_properties()
    china = AzureAccess("acct", "key", None, "https", "acct.blob.core.chinacloudapi.cn")
    assert (
        china.iceberg_properties()["adls.blob-storage-authority"] == ".blob.core.chinacloudapi.cn"
    )


def test_gcs_emulator_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    access = resolve_gcs(GCSObjectStoreOptions(bucket="bucket"))
    key = json.loads(access.object_store_options()["google_service_account_key"])
    assert key["gcs_base_url"] == "http://127.0.0.1:4443"
    assert key["disable_oauth"] is True
    assert access.iceberg_properties()["gcs.service.host"] == "http://127.0.0.1:4443"


def test_gcs_credentials_file_goes_to_delta_and_iceberg_uses_adc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    access = resolve_gcs(GCSObjectStoreOptions(bucket="bucket", credentials_file="/etc/sa.json"))
    assert access.object_store_options() == {"google_service_account": "/etc/sa.json"}
    assert access.iceberg_properties() == {}
