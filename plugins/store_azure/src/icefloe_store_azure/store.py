"""The Azure adapter: the ObjectStore port on azure-storage-blob (block blobs).

How each promise of the port is kept on Azure Blob Storage:

- *Atomic writes*: ``Put Blob`` creates a blob whole; a streamed blob is staged block by
  block (``Put Block``), and only ``Put Block List`` makes it visible, all at once. Blocks
  that are never committed stay invisible and are discarded by the service after a week.
- *Create-if-absent*: ``If-None-Match: *`` on ``Put Blob`` and on ``Put Block List``; Azure
  (and Azurite) answer 409 ``BlobAlreadyExists`` to all writers but one (412
  ``ConditionNotMet`` is accepted too).
- *A retry that already won*: every write carries a random write id in its metadata, and a
  refused condition is reported as :class:`~icefloe.errors.AlreadyExistsError` only after a
  ``HEAD`` shows that the blob there is someone else's
  (:class:`~icefloe.adapters.write_id.WriteIds`).
- *Bounded memory*: ``put_stream`` buffers one block (``part_size``) at a time.

The SDK is synchronous: every call runs on a bounded thread pool (``max_concurrency``
threads, as many pooled connections), never on the event loop
(:class:`~icefloe.adapters.blocking.BlockingSdk`).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping
from typing import Any, Final, Self

from icefloe.adapters.blocking import BlockingSdk
from icefloe.adapters.write_id import WriteIds, new_write_id
from icefloe.errors import AlreadyExistsError, ConflictError, IcefloeError
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import ObjectInfo, ObjectStore, RequestKind, RequestStats
from icefloe_store_azure.engines import resolve_access
from icefloe_store_azure.errors import status_of, translate
from icefloe_store_azure.options import AzureObjectStoreOptions

WRITE_ID: Final = "icefloe_write_id"
"""Blob metadata naming the write that created a blob (metadata names are C# identifiers)."""
_LIST_PAGE: Final = 1000
STREAM_RANGE: Final = 2 << 20
"""Largest range ``get_stream`` asks for at once.

The SDK holds a response about nine times over while it decodes it (measured with
azure-storage-blob 12.31: a 75 MB peak for one 8 MiB range), so streams read small ranges.
"""


class AzureObjectStore(ObjectStore):
    """Block blobs in an Azure container under a prefix; see the module docstring."""

    capabilities = frozenset({ObjectStore.SHARED})
    options_model = AzureObjectStoreOptions

    def __init__(
        self, container: Any, options: AzureObjectStoreOptions, stats: RequestStats
    ) -> None:
        """Wrap an ``azure.storage.blob.ContainerClient``; :meth:`open` is the usual way in.

        Args:
            container: The container client, owned by this store from now on.
            options: The validated options.
            stats: The counters that the client's HTTP session records requests in (see
                :func:`icefloe_store_azure.client.make_container_client`); they become
                :attr:`stats`.
        """
        super().__init__()
        self.stats = stats
        self._container = container
        self._container_name = options.container
        self._access = resolve_access(container)
        self._folder = f"{options.prefix}/" if options.prefix else ""
        self._part_size = options.part_size
        self._sdk = BlockingSdk(
            f"the Azure object store on container {options.container!r}",
            threads=options.max_concurrency,
            thread_name_prefix="icefloe-azure",
            translate=functools.partial(translate, container=options.container),
            sdk_modules=("azure.", "requests", "urllib3"),
        )
        self._write_ids = WriteIds(WRITE_ID, self._metadata_at, refused=ConflictError)

    @classmethod
    async def open(cls, options: AzureObjectStoreOptions, context: OpenContext) -> Self:
        """Connect, and check that the container can be listed so that mistakes show at start.

        Raises:
            ConfigError: no credentials were configured.
            StorageError: the container does not exist or the credentials may not list it.
            UnavailableError: the service cannot be reached.
        """
        from icefloe_store_azure import client as azure  # the SDK is imported only here

        stats = RequestStats()
        try:
            container = await asyncio.to_thread(azure.make_container_client, options, stats)
        except IcefloeError:
            raise
        except Exception as exc:
            raise translate(exc, "open", options.container) from exc
        store = cls(container, options, stats)
        try:
            await store._sdk.call("list (at open)", store._first_page)
        except BaseException:
            await store.close()
            raise
        return store

    async def close(self) -> None:
        """Wait for running calls, then release the connections."""
        if not self._sdk.closed:
            await self._sdk.close()
            self._container.close()

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
        blocks: list[str] = []
        size = 0
        # Exceptions raised by ``chunks`` itself are the caller's and propagate unchanged;
        # the blocks staged so far are never committed, so no blob appears.
        async for chunk in chunks:
            buffer += chunk
            while len(buffer) > self._part_size:
                part = bytes(buffer[: self._part_size])
                del buffer[: self._part_size]
                await self._stage_block(key, write_id, blocks, part)
                size += len(part)
        if not blocks:
            return await self._put(key, buffer, if_absent)  # small: one request
        if buffer:
            await self._stage_block(key, write_id, blocks, bytes(buffer))
            size += len(buffer)
        await self._write(key, write_id, self._commit, key, blocks, write_id, if_absent)
        return ObjectInfo(key, size, time.time())

    async def _get(self, key: str, start: int, end: int | None) -> bytes:
        data = await self._sdk.call(f"get {key!r}", self._download, self._name(key), start, end)
        self.stats.record(RequestKind.GET, len(data), requests=0)
        return data

    async def _get_stream(self, key: str, chunk_size: int) -> AsyncIterator[bytes]:
        async for piece in super()._get_stream(key, min(chunk_size, STREAM_RANGE)):
            yield piece

    async def _head(self, key: str) -> ObjectInfo | None:
        found = await self._sdk.call(f"head {key!r}", self._properties, self._name(key))
        if found is None:
            return None
        return ObjectInfo(key, found.size, found.last_modified.timestamp(), found.etag)

    async def _delete(self, key: str) -> None:
        await self._sdk.call(f"delete {key!r}", self._delete_blob, self._name(key))

    async def _list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        pages = await self._sdk.call(f"list {prefix!r}", self._pages, prefix)
        while True:
            page = await self._sdk.call(f"list {prefix!r}", _next_page, pages)
            if page is None:
                return
            for blob in page:
                yield ObjectInfo(
                    blob.name.removeprefix(self._folder),
                    blob.size,
                    blob.last_modified.timestamp(),
                    blob.etag,
                )

    # --- create-if-absent ---------------------------------------------------------------------

    async def _write(
        self, key: str, write_id: str, request: Callable[..., object], *args: Any
    ) -> None:
        """Send a (conditional) write, resolving a refused condition into its true outcome."""
        put = self._sdk.call(f"put {key!r}", request, *args)
        refusal = await self._write_ids.send(key, write_id, put)
        if refusal is not None:
            raise AlreadyExistsError(f"object {key!r} already exists") from refusal.cause

    async def _metadata_at(self, key: str) -> Mapping[str, str] | None:
        """The metadata of the blob at ``key``, or ``None`` if there is none."""
        found = await self._sdk.call(f"head {key!r}", self._properties, self._name(key))
        return None if found is None else (found.metadata or {})

    # --- how table engines reach the store ---------------------------------------------------

    def _url(self, key: str) -> str:
        return f"abfs://{self._container_name}/{self._name(key)}".rstrip("/")

    def engine_options(self) -> dict[str, str]:
        return self._access.object_store_options()

    def iceberg_properties(self) -> dict[str, str]:
        return self._access.iceberg_properties()

    # --- blocking SDK calls, run on the pool --------------------------------------------------

    def _name(self, key: str) -> str:
        return self._folder + key

    def _upload(self, key: str, body: bytes, write_id: str, if_absent: bool) -> None:
        self._container.upload_blob(
            self._name(key),
            body,
            blob_type="BlockBlob",
            length=len(body),
            metadata={WRITE_ID: write_id},
            overwrite=not if_absent,  # overwrite=False sends If-None-Match: *
            max_concurrency=1,
        )

    def _commit(self, key: str, blocks: list[str], write_id: str, if_absent: bool) -> None:
        conditions = {"if_none_match": "*"} if if_absent else {}
        self._container.get_blob_client(self._name(key)).commit_block_list(
            blocks, metadata={WRITE_ID: write_id}, **conditions
        )

    async def _stage_block(self, key: str, write_id: str, blocks: list[str], part: bytes) -> None:
        # Block ids must have one length within a blob; the write id keeps them apart from
        # the blocks of a concurrent writer of the same key.
        block_id = f"{write_id}-{len(blocks):06d}"
        blob = self._container.get_blob_client(self._name(key))
        await self._sdk.call(f"put {key!r} (block {len(blocks)})", blob.stage_block, block_id, part)
        blocks.append(block_id)
        self.stats.record(RequestKind.PUT, len(part), requests=0)

    def _download(self, name: str, start: int, end: int | None) -> bytes:
        length = None if end is None else end - start
        try:
            downloader = self._container.download_blob(
                name,
                offset=start if start or length is not None else None,
                length=length,
                max_concurrency=1,
            )
            data: bytes = downloader.readall()
        except Exception as exc:
            if status_of(exc) == 416:
                return b""  # the range starts at or past the end of the blob
            raise
        return data

    def _properties(self, name: str) -> Any:
        try:
            return self._container.get_blob_client(name).get_blob_properties()
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise

    def _delete_blob(self, name: str) -> None:
        try:
            self._container.delete_blob(name)
        except Exception as exc:
            if status_of(exc) != 404:
                raise

    def _pages(self, prefix: str) -> Any:
        blobs = self._container.list_blobs(
            name_starts_with=self._name(prefix), results_per_page=_LIST_PAGE
        )
        return blobs.by_page()

    def _first_page(self) -> None:
        blobs = self._container.list_blobs(name_starts_with=self._folder, results_per_page=1)
        _next_page(blobs.by_page())


def _next_page(pages: Any) -> list[Any] | None:
    """The next page of a listing, fetched now (a page object is lazy), or ``None`` at the end."""
    page = next(pages, None)
    return None if page is None else list(page)
