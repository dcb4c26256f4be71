"""Counts every HTTP request the SDK sends, retries included, by :class:`RequestKind`.

The count is taken in the transport (a ``requests`` adapter), below the SDK's retry policy,
so a request that is throttled and retried twice counts three times, as the service bills it.
The same adapter sizes the connection pool.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from requests.adapters import HTTPAdapter

from icefloe.ports.object_store import RequestKind, RequestStats


def kind_of(method: str, url: str) -> RequestKind | None:
    """The kind of a Blob-service request, or ``None`` for requests that are not counted."""
    query = parse_qs(urlsplit(url).query)
    if method == "PUT":
        return RequestKind.PUT  # Put Blob, Put Block, Put Block List
    if method == "DELETE":
        return RequestKind.DELETE
    if method == "HEAD":
        return RequestKind.HEAD
    if method == "GET":
        return RequestKind.LIST if query.get("comp") == ["list"] else RequestKind.GET
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
