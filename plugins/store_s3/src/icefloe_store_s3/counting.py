"""Counts every HTTP request botocore sends, retries included, by :class:`RequestKind`.

The count is taken from botocore's ``before-send`` event, which fires once per attempt: a
request that is throttled and retried twice counts three times, as the service bills it.
"""

from __future__ import annotations

from typing import Any, Final

from icefloe.ports.object_store import RequestKind, RequestStats

KIND_OF_OPERATION: Final[dict[str, RequestKind]] = {
    "PutObject": RequestKind.PUT,
    "CreateMultipartUpload": RequestKind.PUT,
    "UploadPart": RequestKind.PUT,
    "CompleteMultipartUpload": RequestKind.PUT,
    "CopyObject": RequestKind.PUT,
    "GetObject": RequestKind.GET,
    "HeadObject": RequestKind.HEAD,
    "ListObjectsV2": RequestKind.LIST,
    "DeleteObject": RequestKind.DELETE,
    "AbortMultipartUpload": RequestKind.DELETE,
}
"""S3 operations by the kind they are billed as (aborting an upload is an HTTP DELETE)."""


class RequestCounter:
    """A botocore event handler adding one request to ``stats`` per attempt sent."""

    def __init__(self, stats: RequestStats) -> None:
        self._stats = stats

    def __call__(self, event_name: str, **_: Any) -> None:
        operation = event_name.rpartition(".")[2]
        kind = KIND_OF_OPERATION.get(operation)
        if kind is not None:
            self._stats.record(kind)
        # Returning None lets botocore send the request itself.

    def install(self, client: Any) -> None:
        """Count the requests of ``client`` (a boto3 S3 client) from now on."""
        client.meta.events.register("before-send.s3", self)
