"""Builds the Azure container client from the options. Imported only when the backend is opened."""

from __future__ import annotations

import os
import random
from typing import Any

import requests
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.blob import ContainerClient, ExponentialRetry

from icefloe.errors import ConfigError
from icefloe.ports.object_store import RequestStats
from icefloe_store_azure.counting import CountingAdapter
from icefloe_store_azure.options import AzureObjectStoreOptions


class DoublingRetry(ExponentialRetry):
    """Azure's retry rules (throttling, 5xx, dropped connections) with a plain doubling backoff.

    The SDK's own ``ExponentialRetry`` waits ``initial + base**n`` seconds, whole seconds at
    best, which is far too slow for a WAL write that a producer is waiting on.
    """

    def __init__(self, initial_backoff: float, retry_total: int) -> None:
        super().__init__(retry_total=retry_total)
        self._initial = initial_backoff

    def get_backoff_time(self, settings: dict[str, Any]) -> float:
        backoff = min(30.0, self._initial * 2 ** settings["count"])
        return random.uniform(backoff / 2, backoff)  # jitter spreads out retrying writers


def make_container_client(options: AzureObjectStoreOptions, stats: RequestStats) -> Any:
    """A thread-safe container client whose HTTP session counts requests in ``stats``."""
    session = requests.Session()
    adapter = CountingAdapter(stats, pool_size=options.max_concurrency)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    settings: dict[str, Any] = {
        "transport": RequestsTransport(
            session=session,
            connection_timeout=options.connect_timeout,
            read_timeout=options.read_timeout,
        ),
        "retry_policy": DoublingRetry(options.initial_backoff, options.max_attempts - 1),
        # One request per part, whatever the object size: the adapter does the chunking.
        "max_single_put_size": options.part_size,
        "max_block_size": options.part_size,
        "max_single_get_size": options.part_size,
        "max_chunk_get_size": options.part_size,
    }
    connection_string = _secret(options.connection_string) or os.environ.get(
        "AZURE_STORAGE_CONNECTION_STRING"
    )
    if options.account_url is None and connection_string:
        return ContainerClient.from_connection_string(
            connection_string, options.container, **settings
        )
    account_url, credential = _account(options)
    return ContainerClient(account_url, options.container, credential=credential, **settings)


def _account(options: AzureObjectStoreOptions) -> tuple[str, Any]:
    account_url = options.account_url
    if account_url is None:
        account = os.environ.get("AZURE_STORAGE_ACCOUNT")
        if not account:
            raise ConfigError(
                "[object_store.azure] needs credentials: set connection_string, or account_url "
                "with account_key or sas_token, or AZURE_STORAGE_CONNECTION_STRING"
            )
        account_url = f"https://{account}.blob.core.windows.net"
    key = _secret(options.account_key) or os.environ.get("AZURE_STORAGE_KEY")
    sas = _secret(options.sas_token) or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if key:
        account_name = os.environ.get("AZURE_STORAGE_ACCOUNT") or _account_name(account_url)
        return account_url, {"account_name": account_name, "account_key": key}
    return account_url, sas


def _account_name(account_url: str) -> str:
    """``acct`` from ``https://acct.blob.core.windows.net`` or ``http://host:port/acct``."""
    host, _, path = account_url.split("://", 1)[-1].partition("/")
    return path.strip("/") or host.split(".", 1)[0]


def _secret(value: Any) -> str | None:
    return None if value is None else str(value.get_secret_value())
