"""The WAL object format: round trips, ranged chunk reads, and corruption detection."""

from __future__ import annotations

import contextlib
import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.memory_records import MemoryRecords

from icefloe.errors import CorruptDataError
from icefloe.storage.batch import Compression, patch_base_offsets
from icefloe.storage.records import Record, build_batch
from icefloe.storage.walformat import (
    CHUNK_ENTRY_SIZE,
    HEADER_SIZE_V1,
    BatchEntry,
    ChunkInput,
    decode_wal_object,
    encode_wal_object,
    verify_chunk,
)

T0 = 1_700_000_000_000
CREATED = 1_700_000_123_456


def batch(count: int, *, first_timestamp: int = T0, size: int = 50) -> bytes:
    """A produce-shaped batch (base offset 0) with timestamps ``first_timestamp + i``."""
    return build_batch(
        [Record(i, first_timestamp + i, None, bytes([i % 256]) * size) for i in range(count)],
        compression=Compression.NONE,
    )


STREAMS: dict[int, list[bytes]] = {
    9: [batch(2, first_timestamp=T0 + 100), batch(3, first_timestamp=T0 + 50)],
    2: [batch(1) + batch(4, first_timestamp=T0 + 10)],
    2**64 - 1: [batch(5, first_timestamp=T0 + 7)],
}
ENCODED = encode_wal_object(
    [ChunkInput(stream, runs) for stream, runs in STREAMS.items()], created_ms=CREATED
)


def reseal(data: bytearray) -> bytes:
    """Recompute the trailer CRC, so only the structural check under test can fail."""
    struct.pack_into(">I", data, len(data) - 4, crc32c(memoryview(data)[:-4]))
    return bytes(data)


def table_entry_at(index: int) -> int:
    return HEADER_SIZE_V1 + index * CHUNK_ENTRY_SIZE


# --- round trip ------------------------------------------------------------------------------


def test_round_trip_returns_every_stream_in_ascending_order() -> None:
    decoded = decode_wal_object(ENCODED.data)

    assert decoded.created_ms == CREATED
    assert [chunk.stream_id for chunk in decoded.chunks] == [2, 9, 2**64 - 1]
    assert decoded.chunks == tuple(chunk.entry for chunk in ENCODED.chunks)
    for chunk in decoded.chunks:
        assert bytes(decoded.chunk(chunk)) == b"".join(STREAMS[chunk.stream_id])


def test_chunk_entries_count_records_batches_and_timestamps() -> None:
    stream_9 = ENCODED.chunks[1].entry

    assert (stream_9.record_count, stream_9.batch_count) == (5, 2)
    assert (stream_9.min_timestamp, stream_9.max_timestamp) == (T0 + 50, T0 + 101)


def test_per_batch_table_locates_every_batch() -> None:
    stream_2 = ENCODED.chunks[0]
    first, second = batch(1), batch(4, first_timestamp=T0 + 10)

    assert stream_2.batches == (
        BatchEntry(0, 0, len(first), 1, T0, T0),
        BatchEntry(1, len(first), len(second), 4, T0 + 10, T0 + 13),
    )


def test_a_chunk_is_read_with_one_ranged_read_of_its_location() -> None:
    entry = ENCODED.chunks[1].entry
    ranged_read = ENCODED.data[entry.position : entry.position + entry.length]

    verified = verify_chunk(ranged_read)
    patched = patch_base_offsets(ranged_read, 300)

    assert verified == ENCODED.chunks[1].batches
    offsets = [[r.offset for r in b] for b in MemoryRecords(bytes(patched))]
    assert offsets == [[300, 301], [302, 303, 304]]


def test_a_batch_is_read_on_its_own_from_the_per_batch_table() -> None:
    entry, batches = ENCODED.chunks[0]
    assert (entry.position, entry.length) == (ENCODED.chunks[0].position, ENCODED.chunks[0].length)
    second = batches[1]
    start = entry.position + second.position

    patched = patch_base_offsets(ENCODED.data[start : start + second.length], 10 + 1)

    assert [r.offset for r in next(iter(MemoryRecords(bytes(patched))))] == [11, 12, 13, 14]


def test_an_object_without_chunks_round_trips() -> None:
    encoded = encode_wal_object([], created_ms=CREATED)

    assert decode_wal_object(encoded.data).chunks == ()


def test_encoding_refuses_a_stream_without_batches() -> None:
    with pytest.raises(ValueError, match="no record batches"):
        encode_wal_object([ChunkInput(1, [])], created_ms=CREATED)


def test_encoding_refuses_two_chunks_for_one_stream() -> None:
    with pytest.raises(ValueError, match="two chunks"):
        encode_wal_object([ChunkInput(1, [batch(1)]), ChunkInput(1, [batch(2)])], created_ms=0)


def test_encoding_refuses_a_partial_batch() -> None:
    with pytest.raises(ValueError, match="batch"):
        encode_wal_object([ChunkInput(1, [batch(2)[:-1]])], created_ms=CREATED)


@given(
    st.dictionaries(
        st.integers(0, 2**64 - 1),
        st.lists(st.integers(1, 5), min_size=1, max_size=3),
        max_size=5,
    )
)
def test_any_streams_round_trip(counts: dict[int, list[int]]) -> None:
    streams = {stream: [batch(n, size=5) for n in sizes] for stream, sizes in counts.items()}

    encoded = encode_wal_object(
        [ChunkInput(stream, runs) for stream, runs in streams.items()], created_ms=CREATED
    )
    decoded = decode_wal_object(encoded.data)

    assert [c.stream_id for c in decoded.chunks] == sorted(streams)
    for chunk in decoded.chunks:
        assert bytes(decoded.chunk(chunk)) == b"".join(streams[chunk.stream_id])
        assert chunk.record_count == sum(counts[chunk.stream_id])


# --- corruption ------------------------------------------------------------------------------


def test_bad_magic_is_corrupt() -> None:
    data = bytearray(ENCODED.data)
    data[0:8] = b"NOTAWAL!"

    with pytest.raises(CorruptDataError, match="magic"):
        decode_wal_object(reseal(data))


def test_unknown_version_is_corrupt() -> None:
    data = bytearray(ENCODED.data)
    struct.pack_into(">H", data, 8, 2)

    with pytest.raises(CorruptDataError, match="version 2"):
        decode_wal_object(reseal(data))


def test_unknown_flags_are_corrupt() -> None:
    data = bytearray(ENCODED.data)
    struct.pack_into(">H", data, 10, 1)

    with pytest.raises(CorruptDataError, match="flags"):
        decode_wal_object(reseal(data))


def test_checksum_mismatch_is_corrupt() -> None:
    data = bytearray(ENCODED.data)
    data[-1] ^= 0x01

    with pytest.raises(CorruptDataError, match="CRC"):
        decode_wal_object(bytes(data))


def test_unsorted_chunk_table_is_corrupt() -> None:
    data = bytearray(ENCODED.data)
    struct.pack_into(">Q", data, table_entry_at(1), 1)  # stream 9 becomes 1, after stream 2

    with pytest.raises(CorruptDataError, match="not sorted"):
        decode_wal_object(reseal(data))


def test_overlapping_chunks_are_corrupt() -> None:
    data = bytearray(ENCODED.data)
    first = ENCODED.chunks[0].entry
    struct.pack_into(">Q", data, table_entry_at(1) + 8, first.position + 10)

    with pytest.raises(CorruptDataError, match="overlaps"):
        decode_wal_object(reseal(data))


def test_chunk_past_the_end_is_corrupt() -> None:
    data = bytearray(ENCODED.data)
    struct.pack_into(">I", data, table_entry_at(2) + 16, 10**6)

    with pytest.raises(CorruptDataError, match="past the end"):
        decode_wal_object(reseal(data))


def test_chunk_table_past_the_end_is_corrupt() -> None:
    data = bytearray(ENCODED.data)
    struct.pack_into(">II", data, 20, 10**6, 0)
    struct.pack_into(">I", data, 32, 10**6 * CHUNK_ENTRY_SIZE)

    with pytest.raises(CorruptDataError, match="chunk table"):
        decode_wal_object(reseal(data))


def test_table_counts_that_disagree_with_the_batches_are_corrupt() -> None:
    data = bytearray(ENCODED.data)
    struct.pack_into(">I", data, table_entry_at(0) + 20, 6)  # stream 2 holds 5 records

    with pytest.raises(CorruptDataError, match="table entry says"):
        decode_wal_object(reseal(data))


def test_chunk_with_a_bad_batch_crc_fails_verification() -> None:
    entry = ENCODED.chunks[0].entry
    chunk = bytearray(ENCODED.data[entry.position : entry.position + entry.length])
    chunk[-1] ^= 0x04

    with pytest.raises(CorruptDataError, match="CRC"):
        verify_chunk(chunk)


@given(st.integers(0, len(ENCODED.data) - 1), st.integers(1, 255))
def test_any_byte_flip_is_detected(position: int, mask: int) -> None:
    data = bytearray(ENCODED.data)
    data[position] ^= mask

    with pytest.raises(CorruptDataError):
        decode_wal_object(bytes(data))


@given(st.integers(0, len(ENCODED.data) - 1))
def test_any_truncation_is_detected(length: int) -> None:
    with pytest.raises(CorruptDataError):
        decode_wal_object(ENCODED.data[:length])


@given(st.binary(max_size=500))
def test_random_bytes_raise_only_corrupt_data_error(data: bytes) -> None:
    with contextlib.suppress(CorruptDataError):
        decode_wal_object(data)


@given(st.binary(max_size=500))
def test_random_bytes_with_valid_magic_and_checksum_raise_only_corrupt_data_error(
    body: bytes,
) -> None:
    data = bytearray(struct.pack(">8sHH", b"ICEFLWAL", 1, 0) + body + b"\x00" * 4)

    with contextlib.suppress(CorruptDataError):
        decode_wal_object(reseal(data))


@given(st.binary(max_size=300))
def test_verifying_random_chunk_bytes_raises_only_corrupt_data_error(data: bytes) -> None:
    with contextlib.suppress(CorruptDataError):
        verify_chunk(data)
