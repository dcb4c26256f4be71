"""A GCS resumable upload driven chunk by chunk, with its own retries.

The SDK's ``BlobWriter`` cannot be abandoned: it is a file object, and closing it (which
garbage collection does) *finalises* the upload with whatever was written, so a failed stream
would become a truncated object. Here the upload is finalised only by an explicit last chunk,
and an abandoned session simply expires.

Protocol (GCS JSON API, resumable uploads): every chunk but the last is a multiple of 256 KiB
and is answered ``308`` with ``Range: bytes=0-N`` (what the server has persisted); the last
chunk carries the total size and is answered ``200``/``201`` with the object. After a dropped
connection or a retriable status, an empty ``PUT`` with ``Content-Range: bytes */*`` asks how
much arrived, and the upload resumes from there: nothing is sent twice, nothing is skipped.
"""

from __future__ import annotations

import random
import time
from typing import Any, Final

from icefloe.errors import ConflictError, NotFoundError, StorageError, UnavailableError
from icefloe_store_gcs.errors import RETRIABLE_STATUSES

_RESUME_INCOMPLETE: Final = 308


class ResumableUpload:
    """One resumable-upload session, fed sequentially from one thread at a time."""

    def __init__(
        self,
        session: Any,
        url: str,
        *,
        timeout: float,
        initial_backoff: float,
        max_backoff: float,
        deadline: float,
    ) -> None:
        """Args:
        session: The authorised ``requests`` session of the client.
        url: The session URI returned when the upload was created.
        timeout: Seconds per HTTP request.
        initial_backoff: Seconds before the first retry; doubled per retry up to
            ``max_backoff``, with full jitter.
        deadline: Seconds one chunk may take, retries included, before it is given up.
        """
        self._session = session
        self._url = url
        self._timeout = timeout
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._deadline = deadline
        self.persisted = 0
        """Bytes the server has confirmed so far."""

    def send(self, chunk: bytes, *, last: bool) -> dict[str, Any] | None:
        """Upload ``chunk`` after everything persisted so far; the object when ``last``.

        Raises:
            ConflictError: the upload's precondition (``ifGenerationMatch=0``) failed.
            UnavailableError: the chunk could not be delivered before the deadline.
            StorageError: the session is gone or the server refused the chunk.
        """
        start = self.persisted
        total = start + len(chunk) if last else None
        deadline = time.monotonic() + self._deadline
        attempt = 0
        while True:
            offset = self.persisted - start
            try:
                response = self._put(chunk[offset:], self.persisted, total)
            except OSError as exc:  # requests' ConnectionError and Timeout are OSErrors
                failure: BaseException = exc
            else:
                done = self._settle(response, total)
                if done is not None or (not last and self.persisted == start + len(chunk)):
                    return done
                failure = UnavailableError(f"GCS resumable upload: HTTP {response.status_code}")
            attempt += 1
            self._pause(attempt, deadline, failure)
            done = self._recover(total)
            if done is not None:
                return done  # the last chunk had arrived; only its answer was lost

    def cancel(self) -> None:
        """Abandon the session (best effort: an abandoned session expires anyway)."""
        self._session.delete(self._url, timeout=self._timeout)

    def _put(self, data: bytes, offset: int, total: int | None) -> Any:
        if data:
            content_range = f"bytes {offset}-{offset + len(data) - 1}/{total or '*'}"
        else:
            content_range = f"bytes */{total}"  # finalise an upload that ends on a boundary
        return self._session.put(
            self._url, data=data, headers={"Content-Range": content_range}, timeout=self._timeout
        )

    def _settle(self, response: Any, total: int | None) -> dict[str, Any] | None:
        """Learn from an answer: the object if complete, else update :attr:`persisted`."""
        status = response.status_code
        if status in (200, 201):
            resource: dict[str, Any] = response.json()
            self.persisted = int(resource.get("size", total or 0))
            return resource
        if status == _RESUME_INCOMPLETE:
            self.persisted = _persisted_of(response)
            return None
        if status == 412:
            raise ConflictError("GCS resumable upload: precondition failed")
        if status in (404, 410):
            # The session is over: expired, cancelled, or (on emulators that forget finished
            # sessions) completed by an attempt whose answer was lost. The caller checks.
            raise NotFoundError(f"GCS resumable upload: the session is gone (HTTP {status})")
        if status in RETRIABLE_STATUSES:
            return None
        raise StorageError(f"GCS resumable upload refused: HTTP {status}: {response.text[:200]}")

    def _recover(self, total: int | None) -> dict[str, Any] | None:
        """Ask the server how much of the upload it has (after a failed request)."""
        try:
            response = self._session.put(
                self._url,
                headers={"Content-Range": f"bytes */{total or '*'}"},
                timeout=self._timeout,
            )
        except OSError:
            return None  # the next attempt asks again
        return self._settle(response, total)

    def _pause(self, attempt: int, deadline: float, failure: BaseException) -> None:
        delay = min(self._max_backoff, self._initial_backoff * 2 ** (attempt - 1))
        delay = random.uniform(0, delay)
        if time.monotonic() + delay > deadline:
            raise UnavailableError(
                f"GCS resumable upload: gave up after {attempt} attempts: {failure}"
            ) from failure
        time.sleep(delay)


def _persisted_of(response: Any) -> int:
    """Bytes persisted according to a 308's ``Range: bytes=0-N`` (none without the header)."""
    value = response.headers.get("Range")
    if not value:
        return 0
    return int(value.rpartition("-")[2]) + 1
