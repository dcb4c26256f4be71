"""The S3 adapter: the ObjectStore port on boto3.

How each promise of the port is kept on S3:

- *Atomic writes*: a ``PutObject`` or a completed multipart upload appears whole or not at all;
  an aborted (or abandoned) multipart upload never becomes an object.
- *Create-if-absent*: ``If-None-Match: *`` on ``PutObject`` and on
  ``CompleteMultipartUpload``; S3 answers 412 to every writer but the first.
- *A retry that already won*: botocore retries throttling, 5xx and connection errors. If the
  first attempt of a conditional write succeeded but its answer was lost, the retry meets its
  own object and gets 412. Every write therefore carries a random write id in its metadata,
  and a 412 is reported as :class:`~icefloe.errors.AlreadyExistsError` only after a ``HEAD``
  shows that the object there is someone else's (:class:`~icefloe.adapters.write_id.WriteIds`).
- *Bounded memory*: ``put_stream`` buffers one part (``part_size``) at a time.

boto3 is synchronous: every call runs on a bounded thread pool (``max_concurrency`` threads,
as many pooled connections), never on the event loop
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
from icefloe.errors import AlreadyExistsError, StorageError, UnavailableError
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import ObjectInfo, ObjectStore, RequestKind
from icefloe_store_s3.counting import RequestCounter
from icefloe_store_s3.engines import S3Access
from icefloe_store_s3.errors import (
    CONCURRENT_CONDITIONAL_WRITE,
    NOT_FOUND_CODES,
    PRECONDITION_CODES,
    RANGE_NOT_SATISFIABLE,
    error_code,
    translate,
)
from icefloe_store_s3.options import S3ObjectStoreOptions

WRITE_ID: Final = "icefloe-write-id"
"""User metadata naming the write that created an object (``x-amz-meta-icefloe-write-id``)."""
_LIST_PAGE: Final = 1000


class _ConditionNotMet(Exception):
    """A create-if-absent write was refused; whose object is there is not known yet."""


class S3ObjectStore(ObjectStore):
    """Objects in an S3 bucket under a prefix; see the module docstring."""

    capabilities = frozenset({ObjectStore.SHARED})
    options_model = S3ObjectStoreOptions

    def __init__(self, client: Any, options: S3ObjectStoreOptions, access: S3Access) -> None:
        """Wrap a boto3 S3 client; :meth:`open` is the usual way in.

        Args:
            client: A boto3 S3 client (thread-safe), owned by this store from now on.
            options: The validated options.
            access: How table engines reach the bucket (what the client resolved).
        """
        super().__init__()
        self._client = client
        self._access = access
        self._bucket = options.bucket
        self._folder = f"{options.prefix}/" if options.prefix else ""
        self._part_size = options.part_size
        self._attempts = options.max_attempts
        self._sdk = BlockingSdk(
            f"the S3 object store on bucket {options.bucket!r}",
            threads=options.max_concurrency,
            thread_name_prefix="icefloe-s3",
            translate=functools.partial(translate, bucket=options.bucket),
            sdk_modules=("botocore", "boto3", "urllib3"),
        )
        self._write_ids = WriteIds(WRITE_ID, self._metadata_at, refused=_ConditionNotMet)
        RequestCounter(self.stats).install(client)

    @classmethod
    async def open(cls, options: S3ObjectStoreOptions, context: OpenContext) -> Self:
        """Connect, and check that the bucket can be listed so that mistakes show at start.

        Raises:
            StorageError: the bucket does not exist or the credentials may not list it.
            UnavailableError: the service cannot be reached.
        """
        from icefloe_store_s3.client import make_client  # boto3 is imported only here

        client, access = await asyncio.to_thread(make_client, options)
        store = cls(client, options, access)
        try:
            await store._sdk.call(
                "list (at open)",
                store._client.list_objects_v2,
                Bucket=store._bucket,
                Prefix=store._folder,
                MaxKeys=1,
            )
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
        body = bytes(data)  # botocore signs and retries from a bytes body
        write_id = new_write_id()
        await self._write(
            key, if_absent, write_id, self._put_object, key, body, write_id, if_absent
        )
        self.stats.record(RequestKind.PUT, len(body), requests=0)
        return ObjectInfo(key, len(body), time.time())

    async def _put_stream(
        self, key: str, chunks: AsyncIterable[bytes | bytearray | memoryview], if_absent: bool
    ) -> ObjectInfo:
        write_id = new_write_id()
        buffer = bytearray()
        upload: _MultipartUpload | None = None
        size = 0
        try:
            # Exceptions raised by ``chunks`` itself are the caller's and propagate unchanged.
            async for chunk in chunks:
                buffer += chunk
                while len(buffer) > self._part_size:
                    if upload is None:
                        upload = await self._start_upload(key, write_id)
                    part = bytes(buffer[: self._part_size])
                    del buffer[: self._part_size]
                    await self._upload_part(upload, part)
                    size += len(part)
            if upload is None:
                return await self._put(key, buffer, if_absent)  # small: one request
            if buffer or not upload.parts:
                await self._upload_part(upload, bytes(buffer))
                size += len(buffer)
            await self._write(key, if_absent, write_id, self._complete_upload, upload, if_absent)
            upload = None  # completed: nothing to abort
            return ObjectInfo(key, size, time.time())
        finally:
            if upload is not None:
                await self._abort_upload(upload)

    async def _get(self, key: str, start: int, end: int | None) -> bytes:
        data = await self._sdk.call(f"get {key!r}", self._read_range, self._name(key), start, end)
        self.stats.record(RequestKind.GET, len(data), requests=0)
        return data

    async def _head(self, key: str) -> ObjectInfo | None:
        found = await self._sdk.call(f"head {key!r}", self._head_object, self._name(key))
        if found is None:
            return None
        return ObjectInfo(
            key, found["ContentLength"], found["LastModified"].timestamp(), found.get("ETag")
        )

    async def _delete(self, key: str) -> None:
        # S3 answers 204 whether or not the key existed: idempotent by nature.
        await self._sdk.call(
            f"delete {key!r}", self._client.delete_object, Bucket=self._bucket, Key=self._name(key)
        )

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        token: str | None = None
        while True:
            page = await self._sdk.call(f"list {prefix!r}", self._list_page, prefix, token)
            for item in page.get("Contents", ()):
                yield ObjectInfo(
                    item["Key"].removeprefix(self._folder),
                    item["Size"],
                    item["LastModified"].timestamp(),
                    item.get("ETag"),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or token is None:
                return

    # --- create-if-absent ---------------------------------------------------------------------

    async def _write(
        self,
        key: str,
        if_absent: bool,
        write_id: str,
        request: Callable[..., object],
        *args: Any,
    ) -> None:
        """Send a (conditional) write, resolving a refused condition into its true outcome."""
        for _ in range(self._attempts):
            put = self._sdk.call(f"put {key!r}", request, *args)
            refusal = await self._write_ids.send(key, write_id, put)
            if refusal is None:
                return  # written, now or by an earlier attempt whose answer was lost
            if not if_absent:
                # Only a retried completion gets here, and the upload is gone without having
                # become this object: someone aborted it.
                raise StorageError(
                    f"S3 put {key!r}: the multipart upload vanished before completing"
                ) from refusal.cause
            if refusal.taken:
                raise AlreadyExistsError(f"object {key!r} already exists") from refusal.cause
            # Refused, yet nothing is there: a concurrent conditional write failed (S3's 409
            # ConditionalRequestConflict). The key is free again: try once more.
        raise UnavailableError(
            f"S3 put {key!r}: concurrent conditional writes kept conflicting; try again later"
        )

    async def _metadata_at(self, key: str) -> Mapping[str, str] | None:
        """The user metadata of the object at ``key``, or ``None`` if there is none."""
        found = await self._sdk.call(f"head {key!r}", self._head_object, self._name(key))
        return None if found is None else found.get("Metadata", {})

    # --- how table engines reach the store ---------------------------------------------------

    def _url(self, key: str) -> str:
        return f"s3://{self._bucket}/{self._name(key)}".rstrip("/")

    def engine_options(self) -> dict[str, str]:
        return self._access.object_store_options()

    def iceberg_properties(self) -> dict[str, str]:
        return self._access.iceberg_properties()

    # --- blocking SDK calls, run on the pool --------------------------------------------------

    def _name(self, key: str) -> str:
        return self._folder + key

    def _put_object(self, key: str, body: bytes, write_id: str, if_absent: bool) -> None:
        self._conditional(
            self._client.put_object,
            if_absent,
            Bucket=self._bucket,
            Key=self._name(key),
            Body=body,
            Metadata={WRITE_ID: write_id},
        )

    def _complete_upload(self, upload: _MultipartUpload, if_absent: bool) -> None:
        try:
            self._conditional(
                self._client.complete_multipart_upload,
                if_absent,
                Bucket=self._bucket,
                Key=upload.name,
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": upload.parts},
            )
        except Exception as exc:
            # A retried completion whose first attempt went through finds the upload gone:
            # the object may well be ours, which the caller checks by its write id.
            if error_code(exc) in NOT_FOUND_CODES:
                raise _ConditionNotMet from exc
            raise

    def _conditional(self, request: Callable[..., object], if_absent: bool, **kwargs: Any) -> None:
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        try:
            request(**kwargs)
        except Exception as exc:
            if error_code(exc) in PRECONDITION_CODES or (
                error_code(exc) == CONCURRENT_CONDITIONAL_WRITE
            ):
                raise _ConditionNotMet from exc
            raise

    def _read_range(self, name: str, start: int, end: int | None) -> bytes:
        kwargs: dict[str, str] = {}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=name, **kwargs)
        except Exception as exc:
            if error_code(exc) in RANGE_NOT_SATISFIABLE:
                return b""  # the range starts at or past the end of the object
            raise
        body = response["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def _head_object(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self._client.head_object(Bucket=self._bucket, Key=name)
        except Exception as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                return None
            raise
        return found

    def _list_page(self, prefix: str, token: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "Bucket": self._bucket,
            "Prefix": self._name(prefix),
            "MaxKeys": _LIST_PAGE,
        }
        if token is not None:
            kwargs["ContinuationToken"] = token
        page: dict[str, Any] = self._client.list_objects_v2(**kwargs)
        return page

    # --- multipart uploads --------------------------------------------------------------------

    async def _start_upload(self, key: str, write_id: str) -> _MultipartUpload:
        name = self._name(key)
        response = await self._sdk.call(
            f"put {key!r}",
            self._client.create_multipart_upload,
            Bucket=self._bucket,
            Key=name,
            Metadata={WRITE_ID: write_id},
        )
        return _MultipartUpload(name, response["UploadId"])

    async def _upload_part(self, upload: _MultipartUpload, part: bytes) -> None:
        number = len(upload.parts) + 1
        response = await self._sdk.call(
            f"put {upload.name!r} (part {number})",
            self._client.upload_part,
            Bucket=self._bucket,
            Key=upload.name,
            UploadId=upload.upload_id,
            PartNumber=number,
            Body=part,
        )
        upload.parts.append({"PartNumber": number, "ETag": response["ETag"]})
        self.stats.record(RequestKind.PUT, len(part), requests=0)

    async def _abort_upload(self, upload: _MultipartUpload) -> None:
        """Best effort: an upload left behind is invisible, and a bucket lifecycle rule
        (``AbortIncompleteMultipartUpload``) reclaims its parts."""
        if self._sdk.closed:
            return
        abort = self._sdk.call(
            f"abort upload of {upload.name!r}",
            self._client.abort_multipart_upload,
            Bucket=self._bucket,
            Key=upload.name,
            UploadId=upload.upload_id,
        )
        # Shielded: a cancelled writer still cleans up after itself. A failure here is
        # swallowed because the write's own failure is what the caller must see.
        with contextlib.suppress(Exception):
            await asyncio.shield(abort)


class _MultipartUpload:
    """An S3 multipart upload in progress and the parts sent so far."""

    def __init__(self, name: str, upload_id: str) -> None:
        self.name = name
        self.upload_id = upload_id
        self.parts: list[dict[str, Any]] = []
