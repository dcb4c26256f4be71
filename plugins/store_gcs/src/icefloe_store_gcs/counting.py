"""Counts every HTTP request the SDK sends, retries included, by :class:`RequestKind`.

The count is taken in the transport (a ``requests`` adapter), below every retry loop, so a
request that is throttled and retried twice counts three times, as the service bills it.
The same adapter sizes the connection pool.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from requests.adapters import HTTPAdapter

from icefloe.ports.object_store import RequestKind, RequestStats


def kind_of(method: str, url: str) -> RequestKind | None:
    """The kind of a GCS JSON-API request, or ``None`` for requests that are not counted."""
    parts = urlsplit(url)
    path, query = parts.path, parts.query
    if method in ("POST", "PUT"):
        return RequestKind.PUT  # uploads, resumable sessions and chunks, compose, rewrite
    if method == "DELETE":
        return RequestKind.DELETE  # objects, and cancelled resumable sessions
    if method == "GET":
        if "alt=media" in query or path.startswith("/download/"):
            return RequestKind.GET
        if path.endswith("/o"):
            return RequestKind.LIST
        # Object metadata; also the bucket metadata the SDK reads to explain some failures.
        return RequestKind.HEAD
    return None


class CountingAdapter(HTTPAdapter):
    """A ``requests`` transport adapter that records each request it sends in ``stats``."""

    def __init__(self, stats: RequestStats, pool_size: int) -> None:
        super().__init__(pool_connections=pool_size, pool_maxsize=pool_size, max_retries=0)
        self._stats = stats

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        kind = kind_of(request.method or "", request.url or "")
        if kind is not None:
            self._stats.record(kind)
        return super().send(request, *args, **kwargs)
