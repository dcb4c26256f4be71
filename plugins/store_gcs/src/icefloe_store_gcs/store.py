"""The GCS adapter: the ObjectStore port on google-cloud-storage.

How each promise of the port is kept on Google Cloud Storage:

- *Atomic writes*: a one-shot upload, or the last chunk of a resumable upload, creates the
  object whole; an unfinished resumable session never becomes an object.
- *Create-if-absent*: ``ifGenerationMatch=0``, on one-shot uploads and on resumable sessions
  (GCS checks it again when the session is finalised); GCS answers 412 to all writers but one.
  A stream larger than one part is checked with a ``HEAD`` first, so that gigabytes are not
  uploaded for a key that is already taken (fake-gcs-server also needs it: it enforces the
  precondition on one-shot uploads only).
- *A retry that already won*: every write carries a random write id in its metadata, and a
  412 is reported as :class:`~icefloe.errors.AlreadyExistsError` only after a ``HEAD`` shows
  that the object there is someone else's (:class:`~icefloe.adapters.write_id.WriteIds`).
- *Bounded memory*: ``put_stream`` buffers one chunk (``part_size``) at a time.

The SDK is synchronous: every call runs on a bounded thread pool (``max_concurrency``
threads, as many pooled connections), never on the event loop
(:class:`~icefloe.adapters.blocking.BlockingSdk`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Any, Final, Self

from icefloe.adapters.blocking import BlockingSdk
from icefloe.adapters.write_id import WriteIds, new_write_id
from icefloe.errors import (
    AlreadyExistsError,
    ConflictError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import ObjectInfo, ObjectStore, RequestKind, RequestStats
from icefloe_store_gcs.engines import resolve_access
from icefloe_store_gcs.errors import status_of, translate
from icefloe_store_gcs.options import GCSObjectStoreOptions

WRITE_ID: Final = "icefloe-write-id"
"""Custom metadata naming the write that created an object."""
CONTENT_TYPE: Final = "application/octet-stream"
_LIST_PAGE: Final = 1000


class GCSObjectStore(ObjectStore):
    """Objects in a GCS bucket under a prefix; see the module docstring."""

    capabilities = frozenset({ObjectStore.SHARED})
    options_model = GCSObjectStoreOptions

    def __init__(
        self, client: Any, retry: Any, options: GCSObjectStoreOptions, stats: RequestStats
    ) -> None:
        """Wrap a ``google.cloud.storage.Client``; :meth:`open` is the usual way in.

        Args:
            client: The client, owned by this store from now on.
            retry: The ``google.api_core`` retry policy for every SDK call.
            options: The validated options.
            stats: The counters that the client's HTTP session records requests in (see
                :func:`icefloe_store_gcs.client.make_client`); they become :attr:`stats`.
        """
        super().__init__()
        self.stats = stats
        self._client = client
        self._bucket = client.bucket(options.bucket)
        self._bucket_name = options.bucket
        self._retry = retry
        self._options = options
        self._folder = f"{options.prefix}/" if options.prefix else ""
        self._access = resolve_access(options)
        self._part_size = options.part_size
        self._sdk = BlockingSdk(
            f"the GCS object store on bucket {options.bucket!r}",
            threads=options.max_concurrency,
            thread_name_prefix="icefloe-gcs",
            translate=functools.partial(translate, bucket=options.bucket),
            # Connection failures are OSErrors (requests' own too), whichever module raises them.
            sdk_modules=("google.", "requests", "urllib3"),
            sdk_types=(OSError,),
        )
        # A 404 too: the resumable session is gone, maybe finalised by an earlier attempt.
        self._write_ids = WriteIds(
            WRITE_ID, self._metadata_at, refused=(ConflictError, NotFoundError)
        )

    @classmethod
    async def open(cls, options: GCSObjectStoreOptions, context: OpenContext) -> Self:
        """Connect, and check that the bucket can be listed so that mistakes show at start.

        Raises:
            ConfigError: no credentials could be found.
            StorageError: the bucket does not exist or the credentials may not list it.
            UnavailableError: the service cannot be reached.
        """
        from icefloe_store_gcs import client as gcs  # the SDK is imported only here

        stats = RequestStats()
        try:
            client = await asyncio.to_thread(gcs.make_client, options, stats)
        except Exception as exc:
            raise translate(exc, "open", options.bucket) from exc
        store = cls(client, gcs.make_retry(options), options, stats)
        try:
            await store._sdk.call("list (at open)", store._first_page, "")
        except NotFoundError as exc:
            await store.close()
            raise StorageError(
                f"GCS bucket {options.bucket!r} does not exist; create it or fix "
                "[object_store.gcs] bucket"
            ) from exc
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Wait for running calls, then release the connections."""
        if not self._sdk.closed:
            await self._sdk.close()
            self._client.close()

    # --- primitives ---------------------------------------------------------------------------

    async def _put(
        self, key: str, data: bytes | bytearray | memoryview, if_absent: bool
    ) -> ObjectInfo:
        body = bytes(data)
        write_id = new_write_id()
        await self._write(key, write_id, self._upload, key, body, write_id, if_absent)
        self.stats.record(RequestKind.PUT, len(body), requests=0)
        return ObjectInfo(key, len(body), time.time())

    async def _put_stream(
        self, key: str, chunks: AsyncIterable[bytes | bytearray | memoryview], if_absent: bool
    ) -> ObjectInfo:
        write_id = new_write_id()
        buffer = bytearray()
        upload: Any = None
        size = 0
        try:
            # Exceptions raised by ``chunks`` itself are the caller's and propagate unchanged.
            async for chunk in chunks:
                buffer += chunk
                while len(buffer) > self._part_size:
                    if upload is None:
                        upload = await self._start_upload(key, write_id, if_absent)
                    part = bytes(buffer[: self._part_size])
                    del buffer[: self._part_size]
                    await self._send_chunk(key, upload, part, last=False)
                    size += len(part)
            if upload is None:
                return await self._put(key, buffer, if_absent)  # small: one request
            await self._write(key, write_id, self._finish_upload, upload, bytes(buffer))
            upload = None  # finalised: nothing to cancel
            return ObjectInfo(key, size + len(buffer), time.time())
        finally:
            if upload is not None:
                await self._cancel_upload(upload)

    async def _get(self, key: str, start: int, end: int | None) -> bytes:
        data = await self._sdk.call(f"get {key!r}", self._download, self._name(key), start, end)
        self.stats.record(RequestKind.GET, len(data), requests=0)
        return data

    async def _head(self, key: str) -> ObjectInfo | None:
        blob = await self._sdk.call(f"head {key!r}", self._get_blob, self._name(key))
        if blob is None:
            return None
        return ObjectInfo(key, blob.size, blob.updated.timestamp(), blob.etag)

    async def _delete(self, key: str) -> None:
        await self._sdk.call(f"delete {key!r}", self._delete_blob, self._name(key))

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        pages = await self._sdk.call(f"list {prefix!r}", self._pages, prefix)
        while True:
            page = await self._sdk.call(f"list {prefix!r}", next, pages, None)
            if page is None:
                return
            for blob in page:
                yield ObjectInfo(
                    blob.name.removeprefix(self._folder),
                    blob.size,
                    blob.updated.timestamp(),
                    blob.etag,
                )

    # --- create-if-absent ---------------------------------------------------------------------

    async def _write(
        self, key: str, write_id: str, request: Callable[..., object], *args: Any
    ) -> None:
        """Send a (conditional) write, resolving a refused condition into its true outcome."""
        put = self._sdk.call(f"put {key!r}", request, *args)
        refusal = await self._write_ids.send(key, write_id, put)
        if refusal is None:
            return  # written, now or by an earlier attempt whose answer was lost
        if isinstance(refusal.error, NotFoundError):
            raise UnavailableError(
                f"GCS put {key!r}: the upload session ended without creating the object; "
                "write it again"
            ) from refusal.error
        raise AlreadyExistsError(f"object {key!r} already exists") from refusal.cause

    async def _metadata_at(self, key: str) -> Mapping[str, str] | None:
        """The custom metadata of the object at ``key``, or ``None`` if there is none."""
        blob = await self._sdk.call(f"head {key!r}", self._get_blob, self._name(key))
        return None if blob is None else (blob.metadata or {})

    # --- how table engines reach the store ---------------------------------------------------

    def _url(self, key: str) -> str:
        return f"gs://{self._bucket_name}/{self._name(key)}".rstrip("/")

    def engine_options(self) -> dict[str, str]:
        return self._access.object_store_options()

    def iceberg_properties(self) -> dict[str, str]:
        return self._access.iceberg_properties()

    # --- blocking SDK calls, run on the pool --------------------------------------------------

    def _name(self, key: str) -> str:
        return self._folder + key

    def _new_blob(self, key: str, write_id: str) -> Any:
        blob = self._bucket.blob(self._name(key))
        blob.metadata = {WRITE_ID: write_id}
        return blob

    def _upload(self, key: str, body: bytes, write_id: str, if_absent: bool) -> None:
        self._new_blob(key, write_id).upload_from_string(
            body,
            content_type=CONTENT_TYPE,
            if_generation_match=0 if if_absent else None,
            # Retrying a whole-object upload of the same bytes is safe even without a
            # precondition, so every upload is retried, not only conditional ones.
            retry=self._retry,
            timeout=self._options.timeout,
        )

    def _download(self, name: str, start: int, end: int | None) -> bytes:
        try:
            data: bytes = self._bucket.blob(name).download_as_bytes(
                start=start or None,
                end=None if end is None else end - 1,  # the SDK's end is inclusive
                checksum=None if start or end is not None else "auto",
                retry=self._retry,
                timeout=self._options.timeout,
            )
        except Exception as exc:
            if status_of(exc) == 416:
                return b""  # the range starts at or past the end of the object
            raise
        return data

    def _get_blob(self, name: str) -> Any:
        return self._bucket.get_blob(name, retry=self._retry, timeout=self._options.timeout)

    def _delete_blob(self, name: str) -> None:
        try:
            self._bucket.delete_blob(name, retry=self._retry, timeout=self._options.timeout)
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    def _pages(self, prefix: str) -> Any:
        blobs = self._client.list_blobs(
            self._bucket_name,
            prefix=self._name(prefix),
            page_size=_LIST_PAGE,
            retry=self._retry,
            timeout=self._options.timeout,
        )
        return iter(blobs.pages)

    def _first_page(self, prefix: str) -> None:
        blobs = self._client.list_blobs(
            self._bucket_name,
            prefix=self._name(prefix),
            max_results=1,
            retry=self._retry,
            timeout=self._options.timeout,
        )
        next(iter(blobs.pages), None)

    # --- resumable uploads --------------------------------------------------------------------

    async def _start_upload(self, key: str, write_id: str, if_absent: bool) -> Any:
        if if_absent and await self._head(key) is not None:
            raise AlreadyExistsError(f"object {key!r} already exists")
        return await self._sdk.call(f"put {key!r}", self._create_session, key, write_id, if_absent)

    def _create_session(self, key: str, write_id: str, if_absent: bool) -> Any:
        from icefloe_store_gcs.resumable import ResumableUpload

        url = self._new_blob(key, write_id).create_resumable_upload_session(
            content_type=CONTENT_TYPE,
            if_generation_match=0 if if_absent else None,
            retry=self._retry,
            timeout=self._options.timeout,
        )
        return ResumableUpload(
            self._client._http,
            url,
            timeout=self._options.timeout,
            initial_backoff=self._options.initial_backoff,
            max_backoff=self._options.max_backoff,
            deadline=self._options.retry_deadline,
        )

    async def _send_chunk(self, key: str, upload: Any, part: bytes, *, last: bool) -> None:
        await self._sdk.call(f"put {key!r}", upload.send, part, last=last)
        self.stats.record(RequestKind.PUT, len(part), requests=0)

    def _finish_upload(self, upload: Any, part: bytes) -> None:
        upload.send(part, last=True)
        self.stats.record(RequestKind.PUT, len(part), requests=0)

    async def _cancel_upload(self, upload: Any) -> None:
        if self._sdk.closed:
            return
        # Shielded: a cancelled writer still cleans up after itself. A failure here is
        # swallowed because the write's own failure is what the caller must see.
        with contextlib.suppress(Exception):
            await asyncio.shield(self._sdk.call("cancel upload", upload.cancel))
