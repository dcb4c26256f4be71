"""Builds the GCS client from the options. Imported only when the backend is opened."""

from __future__ import annotations

import json
import os
from typing import Any, Final

import google.auth
from google.api_core.retry import Retry
from google.auth.credentials import AnonymousCredentials, Credentials
from google.auth.transport.requests import AuthorizedSession
from google.cloud import storage  # type: ignore[import-untyped]
from google.cloud.storage.retry import DEFAULT_RETRY  # type: ignore[import-untyped]

from icefloe.ports.object_store import RequestStats
from icefloe_store_gcs.counting import CountingAdapter
from icefloe_store_gcs.engines import EMULATOR_ENV
from icefloe_store_gcs.options import GCSObjectStoreOptions

SCOPES: Final = ("https://www.googleapis.com/auth/devstorage.read_write",)


def make_client(options: GCSObjectStoreOptions, stats: RequestStats) -> Any:
    """A GCS client whose HTTP session counts requests in ``stats`` and pools connections.

    The session is ours rather than the SDK's so that every request, resumable-upload chunks
    included, passes through the counting adapter.
    """
    endpoint = options.endpoint or os.environ.get(EMULATOR_ENV) or None
    credentials, project = _credentials(options, emulated=endpoint is not None)
    session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
    adapter = CountingAdapter(stats, pool_size=options.max_concurrency)
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    client_options = {"api_endpoint": endpoint} if endpoint else None
    return storage.Client(
        project=options.project or project or "<none>",
        credentials=credentials,
        client_options=client_options,
        _http=session,
    )


def make_retry(options: GCSObjectStoreOptions) -> Retry:
    """The SDK's retry predicate (429, 408, 5xx, connection errors) with our backoff."""
    retry: Retry = DEFAULT_RETRY.with_delay(
        initial=options.initial_backoff, maximum=options.max_backoff, multiplier=2.0
    ).with_timeout(options.retry_deadline)
    return retry


def _credentials(options: GCSObjectStoreOptions, emulated: bool) -> tuple[Credentials, str | None]:
    if options.credentials_json is not None:
        info = json.loads(options.credentials_json.get_secret_value())
        credentials, project = google.auth.load_credentials_from_dict(  # type: ignore[no-untyped-call]
            info, scopes=SCOPES
        )
        return credentials, project
    if options.credentials_file is not None:
        credentials, project = google.auth.load_credentials_from_file(  # type: ignore[no-untyped-call]
            options.credentials_file, scopes=SCOPES
        )
        return credentials, project
    if options.anonymous or emulated:
        # As the SDK itself does for STORAGE_EMULATOR_HOST: emulators check no credentials.
        return AnonymousCredentials(), None  # type: ignore[no-untyped-call]
    credentials, project = google.auth.default(scopes=SCOPES)
    return credentials, project
