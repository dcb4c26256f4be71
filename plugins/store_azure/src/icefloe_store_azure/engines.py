"""How table engines reach the container: the store's own account, credential and endpoint, in
each engine's vocabulary, so that an operator sets them once, in ``[object_store.azure]``.

Everything is read back from the container client, so that a connection string, separate
settings and the ``AZURE_STORAGE_*`` environment variables all end up the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

PUBLIC_SUFFIX: Final = ".blob.core.windows.net"


@dataclass(frozen=True)
class AzureAccess:
    """The account, its credential and, off the public cloud, its blob endpoint."""

    account: str
    account_key: str | None
    sas_token: str | None
    scheme: str
    """``https``, or ``http`` for an emulator."""
    host: str
    """``acct.blob.core.windows.net``, or ``127.0.0.1:10000/devstoreaccount1`` for Azurite."""

    @property
    def public_cloud(self) -> bool:
        return self.host == self.account + PUBLIC_SUFFIX

    def object_store_options(self) -> dict[str, str]:
        """For delta-rs, DuckDB's delta extension and Polars (the ``object_store`` crate)."""
        options = {"azure_storage_account_name": self.account}
        if self.account_key:
            options["azure_storage_account_key"] = self.account_key
        if self.sas_token:
            options["azure_storage_sas_key"] = self.sas_token
        if not self.public_cloud:
            options["azure_endpoint"] = f"{self.scheme}://{self.host}"
            if self.scheme == "http":
                options["azure_allow_http"] = "true"
        return options

    def iceberg_properties(self) -> dict[str, str]:
        """For pyiceberg's FileIO on pyarrow's ``AzureFileSystem``."""
        properties = {
            # These are pyarrow's settings: make pyiceberg use pyarrow even where adlfs is
            # installed (it would otherwise prefer it for abfs:// locations).
            "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
            "adls.account-name": self.account,
        }
        if self.account_key:
            properties["adls.account-key"] = self.account_key
        if self.sas_token:
            properties["adls.sas-token"] = self.sas_token
        if not self.public_cloud:
            hostname = self.host.split("/", 1)[0]
            # A sovereign cloud keeps account subdomains (".blob.core.chinacloudapi.cn"); an
            # emulator takes the account in the path, which a bare authority tells pyarrow.
            authority = hostname.removeprefix(self.account) if "/" not in self.host else hostname
            for service in ("blob", "dfs"):
                properties[f"adls.{service}-storage-authority"] = authority
                properties[f"adls.{service}-storage-scheme"] = self.scheme
        return properties


def resolve_access(container: Any) -> AzureAccess:
    """What the ``ContainerClient`` ``container`` uses, for engines to use the same."""
    return AzureAccess(
        account=container.account_name,
        account_key=getattr(container.credential, "account_key", None),
        sas_token=urlsplit(container.url).query or None,
        scheme=container.scheme,
        host=container.primary_hostname,
    )
