"""Reading chosen row groups of a Parquet file through the ObjectStore port.

pyarrow reads Parquet from a synchronous file; the object store is asynchronous and remote. So
the reads pyarrow will need are fetched first, with ranged GETs (the footer, then the column
chunks of the wanted row groups), into a sparse in-memory file that pyarrow then reads without
I/O, and without copying: it takes views of the fetched bytes. Footers are cached, parsed, so a
consumer catching up through a file costs one GET per row group and no footer parse.
"""

from __future__ import annotations

import io
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import pyarrow as pa
import pyarrow.parquet as pq

from icefloe.errors import CorruptDataError
from icefloe.ports.object_store import ObjectStore
from icefloe.storage.row_schema import PARTITION, ROW_SCHEMA

TAIL_GUESS: Final = 64 << 10
"""Bytes fetched from the end of a file at once: usually the whole footer in one GET."""
FETCHED_HOLE_BYTES: Final = 64 << 10
"""Bytes between two wanted column chunks (another column's chunk, such as the partition's)
fetched with them. pyarrow coalesces the reads of chunks apart by up to 8 KiB (its
``hole_size_limit``) into one read, which must find every byte fetched."""
_MAGIC: Final = b"PAR1"
_FRAME: Final = 12
"""The fewest bytes of a Parquet file: its leading magic, then footer length and magic."""
KAFKA_COLUMNS: Final = [name for name in ROW_SCHEMA.names if name != PARTITION]
"""What catch-up reads rebuild batches from: not the partition (a file holds one stream's
rows), nor the typed columns a schema-backed topic's file also has."""


class _SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges are present."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ranges: list[tuple[int, memoryview]] = []
        self._position = 0

    def add(self, start: int, data: bytes | memoryview) -> None:
        self._ranges.append((start, memoryview(data)))

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = base + offset
        return self._position

    def read(self, size: int = -1) -> bytes | memoryview:
        """The next ``size`` bytes: a view of fetched bytes (pyarrow keeps it without a copy),
        or a copy joined from ranges fetched apart."""
        end = self._size if size < 0 else min(self._size, self._position + size)
        for start, data in self._ranges:
            if start <= self._position and end <= start + len(data):
                view = data[self._position - start : end - start]
                self._position = end
                return view
        pieces = []
        position = self._position
        # A read may span ranges fetched separately (a column chunk, then the footer).
        while position < end:
            for start, data in self._ranges:
                if start <= position < start + len(data):
                    piece = data[position - start : min(end, start + len(data)) - start]
                    pieces.append(piece)
                    position += len(piece)
                    break
            else:
                raise OSError(f"bytes [{position}, {end}) were not fetched")
        self._position = end
        return b"".join(pieces)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@dataclass(frozen=True)
class FetchedRowGroups:
    """Row groups of a Parquet file whose bytes are in memory, to decode off the event loop."""

    file: _SparseFile
    metadata: pq.FileMetaData
    row_groups: list[int]

    def decode(self) -> pa.Table:
        """The Kafka columns of the row groups (not the typed columns a schema-backed topic's
        file also has: those are for the tables). CPU work: call it in a worker thread."""
        parquet = pq.ParquetFile(self.file, metadata=self.metadata)
        # One thread: the caller's. Arrow's own pool would add thread hand-offs to a
        # decode of about a megabyte; concurrent reads already use the cores.
        return parquet.read_row_groups(self.row_groups, columns=KAFKA_COLUMNS, use_threads=False)


class ParquetRangeReader:
    """Reads row groups of Parquet files in an object store, caching footers."""

    def __init__(self, store: ObjectStore, footer_cache: int = 256) -> None:
        self._store = store
        self._footers: OrderedDict[str, tuple[int, bytes, pq.FileMetaData]] = OrderedDict()
        self._capacity = footer_cache

    async def fetch(self, key: str, size: int, row_groups: list[int]) -> FetchedRowGroups:
        """The bytes of ``row_groups`` of the file ``key`` of ``size`` bytes, ready to decode.

        Raises:
            CorruptDataError: the file does not end as a Parquet file does.
        """
        tail_start, tail, metadata = await self._footer(key, size)
        sparse = _SparseFile(size)
        sparse.add(tail_start, tail)
        for start, end in _column_chunk_ranges(metadata, row_groups):
            if start < tail_start:
                # A view: a store that reads into a buffer of its own spares a copy.
                sparse.add(start, await self._store.get_view(key, start, min(end, tail_start)))
        return FetchedRowGroups(sparse, metadata, row_groups)

    async def metadata(self, key: str, size: int) -> pq.FileMetaData:
        """The footer of the file ``key`` of ``size`` bytes (one ranged GET, then cached).

        Raises:
            CorruptDataError: the file does not end as a Parquet file does.
        """
        return (await self._footer(key, size))[2]

    async def _footer(self, key: str, size: int) -> tuple[int, bytes, pq.FileMetaData]:
        cached = self._footers.get(key)
        if cached is not None:
            self._footers.move_to_end(key)
            return cached
        tail_start = max(0, size - TAIL_GUESS)
        tail = await self._store.get(key, tail_start, size)
        if len(tail) < _FRAME or tail[-4:] != _MAGIC:
            raise CorruptDataError(f"{key}: {len(tail)} bytes that do not end a Parquet file")
        (footer_length,) = struct.unpack_from("<i", tail, len(tail) - 8)
        needed = footer_length + 8
        if footer_length <= 0 or needed > size - 4:
            raise CorruptDataError(
                f"{key}: a Parquet footer of {footer_length} bytes in a file of {size} bytes"
            )
        if needed > len(tail):
            tail_start = size - needed
            tail = await self._store.get(key, tail_start, size)
        sparse = _SparseFile(size)
        sparse.add(tail_start, tail)
        metadata = pq.ParquetFile(sparse).metadata
        entry = (tail_start, tail, metadata)
        self._footers[key] = entry
        while len(self._footers) > self._capacity:
            self._footers.popitem(last=False)
        return entry


def _column_chunk_ranges(metadata: pq.FileMetaData, row_groups: list[int]) -> list[tuple[int, int]]:
    """Byte ranges of the Kafka columns' chunks of the row groups, merged where adjacent or
    apart by at most :data:`FETCHED_HOLE_BYTES` (pyarrow reads small holes rather than seek)."""
    ranges = []
    for i in row_groups:
        group = metadata.row_group(i)
        for j in range(group.num_columns):
            column = group.column(j)
            if column.path_in_schema.split(".", 1)[0] not in KAFKA_COLUMNS:
                continue
            start = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset is not None:
                start = min(start, column.dictionary_page_offset)
            ranges.append((start, start + column.total_compressed_size))
    ranges.sort()
    merged: list[tuple[int, int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1] + FETCHED_HOLE_BYTES:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
