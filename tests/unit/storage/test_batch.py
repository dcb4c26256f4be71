"""Record batch headers: produce-path validation with Kafka's error codes, and offset patching.

Batches come from kafka-python's own builder, an implementation independent of ours. It only
ships gzip in this environment; for snappy, lz4 and zstd the ``kafka_python_codecs`` fixture
plugs cramjam into kafka-python's codec hooks (its batch code and its xerial snappy framing
stay kafka-python's own).
"""

from __future__ import annotations

import contextlib
import os
import struct
from types import SimpleNamespace

import cramjam
import kafka.codec
import kafka.record.default_records as kafka_records
import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kio.schema.errors import ErrorCode

from icefloe.errors import CorruptDataError
from icefloe.storage.batch import (
    HEADER,
    BatchError,
    Compression,
    TimestampType,
    patch_base_offsets,
    patch_base_offsets_into,
    read_header,
    split_and_validate,
    with_log_append_time,
)
from icefloe.storage.records import Record, build_batch, decode_batch

LIMIT = 1 << 20
T0 = 1_700_000_000_123


@pytest.fixture
def kafka_python_codecs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give kafka-python snappy, lz4 and zstd through cramjam."""

    def lz4_frame(payload: bytes) -> bytes:
        compressor = cramjam.lz4.Compressor(block_linked=False)
        compressor.compress(bytes(payload))
        return bytes(compressor.finish())

    monkeypatch.setattr(
        kafka.codec,
        "snappy",
        SimpleNamespace(
            compress=lambda data: bytes(cramjam.snappy.compress_raw(bytes(data))),
            decompress=lambda data: bytes(cramjam.snappy.decompress_raw(bytes(data))),
        ),
    )
    monkeypatch.setattr(kafka.codec, "lz4", SimpleNamespace())
    monkeypatch.setattr(kafka_records, "lz4_encode", lz4_frame)
    monkeypatch.setattr(
        kafka_records, "lz4_decode", lambda data: bytes(cramjam.lz4.decompress(bytes(data)))
    )
    monkeypatch.setattr(kafka.codec, "zstd", SimpleNamespace())
    monkeypatch.setattr(
        kafka_records, "zstd_encode", lambda data: bytes(cramjam.zstd.compress(bytes(data)))
    )
    monkeypatch.setattr(
        kafka_records, "zstd_decode", lambda data: bytes(cramjam.zstd.decompress(bytes(data)))
    )


def kafka_python_batch(
    count: int = 3,
    *,
    compression: Compression = Compression.NONE,
    producer: tuple[int, int, int] = (-1, -1, -1),
    transactional: bool = False,
    first_timestamp: int = T0,
) -> bytes:
    producer_id, epoch, sequence = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(compression),
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=LIMIT,
    )
    for i in range(count):
        # Compressible values, so kafka-python keeps the compressed form.
        value = bytes([i % 251]) * 300
        builder.append(i, first_timestamp + 7 * i, f"k{i}".encode(), value, [("h", b"v")])
    return bytes(builder.build())


def with_header(batch: bytes, *, keep_crc: bool = False, **fields: int) -> bytes:
    """The batch with header fields replaced, its CRC recomputed unless ``keep_crc``."""
    header = read_header(batch)._replace(**fields)
    rebuilt = bytearray(batch)
    HEADER.pack_into(rebuilt, 0, *header)
    if not keep_crc:
        struct.pack_into(">I", rebuilt, 17, crc32c(memoryview(rebuilt)[21:]))
    return bytes(rebuilt)


def rejection(data: bytes, *, limit: int = LIMIT) -> ErrorCode:
    with pytest.raises(BatchError) as caught:
        split_and_validate(data, max_batch_bytes=limit)
    assert str(caught.value)
    return caught.value.error_code


# --- accepting -------------------------------------------------------------------------------


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("compression", list(Compression))
def test_accepts_kafka_python_batches_of_every_codec(compression: Compression) -> None:
    batch = kafka_python_batch(4, compression=compression)
    assert read_header(batch).compression is compression

    [info] = split_and_validate(batch, max_batch_bytes=LIMIT)

    assert (info.position, info.size, info.record_count) == (0, len(batch), 4)
    assert info.compression is compression


def test_reports_each_batch_of_concatenated_produce_data() -> None:
    first = kafka_python_batch(2, first_timestamp=T0)
    second = kafka_python_batch(5, first_timestamp=T0 + 1000)

    infos = split_and_validate(memoryview(first + second), max_batch_bytes=LIMIT)

    assert [(i.position, i.size, i.record_count) for i in infos] == [
        (0, len(first), 2),
        (len(first), len(second), 5),
    ]
    assert [(i.base_timestamp, i.max_timestamp) for i in infos] == [
        (T0, T0 + 7),
        (T0 + 1000, T0 + 1000 + 28),
    ]


def test_reports_idempotent_and_transactional_producer_fields() -> None:
    batch = kafka_python_batch(3, producer=(4242, 7, 90), transactional=True)

    [info] = split_and_validate(batch, max_batch_bytes=LIMIT)

    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (4242, 7, 90)
    assert info.is_transactional


def test_non_idempotent_batch_reports_no_producer() -> None:
    [info] = split_and_validate(kafka_python_batch(), max_batch_bytes=LIMIT)

    assert (info.producer_id, info.producer_epoch, info.base_sequence) == (-1, -1, -1)
    assert not info.is_transactional


def test_header_properties_decode_the_attributes() -> None:
    header = read_header(with_header(kafka_python_batch(), attributes=0b111010))

    assert header.compression is Compression.SNAPPY
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert header.is_transactional
    assert header.is_control


def test_batch_of_exactly_the_limit_is_accepted() -> None:
    batch = kafka_python_batch()

    assert len(split_and_validate(batch, max_batch_bytes=len(batch))) == 1


# --- rejecting, with Kafka's error codes ------------------------------------------------------


def test_empty_produce_data_is_invalid_record() -> None:
    assert rejection(b"") is ErrorCode.invalid_record


def test_flipped_byte_under_the_crc_is_corrupt_message() -> None:
    batch = bytearray(kafka_python_batch())
    batch[-1] ^= 0x01

    assert rejection(bytes(batch)) is ErrorCode.corrupt_message


def test_flipped_crc_byte_is_corrupt_message() -> None:
    batch = bytearray(kafka_python_batch())
    batch[18] ^= 0x80

    assert rejection(bytes(batch)) is ErrorCode.corrupt_message


def test_truncated_batch_is_corrupt_message() -> None:
    assert rejection(kafka_python_batch()[:-1]) is ErrorCode.corrupt_message


def test_truncated_header_is_corrupt_message() -> None:
    assert rejection(kafka_python_batch()[:40]) is ErrorCode.corrupt_message


def test_trailing_partial_batch_is_corrupt_message() -> None:
    batch = kafka_python_batch()

    assert rejection(batch + batch[:30]) is ErrorCode.corrupt_message


def test_batch_length_below_a_header_is_corrupt_message() -> None:
    assert rejection(with_header(kafka_python_batch(), batch_length=20)) is (
        ErrorCode.corrupt_message
    )


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_magic_is_invalid_record(magic: int) -> None:
    assert rejection(with_header(kafka_python_batch(), magic=magic)) is ErrorCode.invalid_record


@pytest.mark.parametrize("magic", [3, -1])
def test_unknown_magic_is_corrupt_message(magic: int) -> None:
    assert rejection(with_header(kafka_python_batch(), magic=magic)) is (ErrorCode.corrupt_message)


def test_non_zero_base_offset_is_invalid_record() -> None:
    assert rejection(with_header(kafka_python_batch(), base_offset=5)) is (ErrorCode.invalid_record)


def test_batch_over_the_limit_is_message_too_large() -> None:
    batch = kafka_python_batch()

    assert rejection(batch, limit=len(batch) - 1) is ErrorCode.message_too_large


def test_record_count_disagreeing_with_last_offset_delta_is_invalid_record() -> None:
    assert rejection(with_header(kafka_python_batch(3), record_count=4)) is (
        ErrorCode.invalid_record
    )


def test_zero_record_count_is_invalid_record() -> None:
    batch = with_header(kafka_python_batch(1), record_count=0, last_offset_delta=-1)

    assert rejection(batch) is ErrorCode.invalid_record


def test_control_batch_is_invalid_record() -> None:
    assert rejection(with_header(kafka_python_batch(), attributes=0x20)) is (
        ErrorCode.invalid_record
    )


def test_unknown_codec_is_unsupported_compression_type() -> None:
    assert rejection(with_header(kafka_python_batch(), attributes=5)) is (
        ErrorCode.unsupported_compression_type
    )


def test_producer_set_log_append_time_is_invalid_timestamp() -> None:
    assert rejection(with_header(kafka_python_batch(), attributes=0x08)) is (
        ErrorCode.invalid_timestamp
    )


def test_idempotent_batch_without_sequence_is_invalid_record() -> None:
    batch = with_header(kafka_python_batch(), producer_id=9, producer_epoch=0, base_sequence=-1)

    assert rejection(batch) is ErrorCode.invalid_record


def test_one_bad_batch_rejects_the_whole_produce_data() -> None:
    good = kafka_python_batch()
    bad = bytearray(good)
    bad[-1] ^= 0xFF

    assert rejection(good + bytes(bad)) is ErrorCode.corrupt_message


@given(st.binary(max_size=300))
def test_random_bytes_raise_only_batch_error(data: bytes) -> None:
    with contextlib.suppress(BatchError):
        split_and_validate(data, max_batch_bytes=LIMIT)


VALID = kafka_python_batch(3)
LEADER_EPOCH = range(12, 16)
"""partitionLeaderEpoch: neither checked nor covered by the CRC (the broker sets it)."""


@given(st.integers(0, len(VALID) - 1), st.integers(1, 255))
def test_any_byte_flip_outside_the_leader_epoch_is_rejected(position: int, mask: int) -> None:
    mutated = bytearray(VALID)
    mutated[position] ^= mask

    if position in LEADER_EPOCH:
        assert len(split_and_validate(bytes(mutated), max_batch_bytes=LIMIT)) == 1
    else:
        with pytest.raises(BatchError):
            split_and_validate(bytes(mutated), max_batch_bytes=LIMIT)


@given(st.integers(0, len(VALID) - 1))
def test_any_truncation_is_rejected(length: int) -> None:
    with pytest.raises(BatchError):
        split_and_validate(VALID[:length], max_batch_bytes=LIMIT)


# --- patching base offsets -------------------------------------------------------------------


def kafka_python_offsets(data: bytes | bytearray) -> list[list[int]]:
    """Record offsets per batch as kafka-python reads them, after it checks every CRC."""
    offsets = []
    for batch in MemoryRecords(bytes(data)):
        assert batch.validate_crc()
        offsets.append([record.offset for record in batch])
    return offsets


def chunk_of(*counts: int) -> bytes:
    return b"".join(kafka_python_batch(count) for count in counts)


def test_patching_numbers_consecutive_batches_from_the_first_offset() -> None:
    patched = patch_base_offsets(chunk_of(2, 3, 1), 100)

    assert kafka_python_offsets(patched) == [[100, 101], [102, 103, 104], [105]]


def test_patching_keeps_every_crc_valid() -> None:
    chunk = chunk_of(2, 3)

    patched = patch_base_offsets(chunk, 7_000_000_000)

    for info in split_and_validate(chunk, max_batch_bytes=LIMIT):
        span = slice(info.position, info.position + info.size)
        assert read_header(patched, info.position).crc == crc32c(patched[span][21:])
        assert patched[span][8:] == chunk[span][8:]


def test_patching_leaves_the_input_untouched() -> None:
    chunk = bytearray(chunk_of(2))

    patch_base_offsets(chunk, 50)

    assert read_header(chunk).base_offset == 0


def test_patching_from_a_later_batch_of_a_chunk() -> None:
    chunk = chunk_of(2, 3, 1)
    second = split_and_validate(chunk, max_batch_bytes=LIMIT)[1].position

    patched = patch_base_offsets(memoryview(chunk)[second:], 42)

    assert kafka_python_offsets(patched) == [[42, 43, 44], [45]]


def test_patching_writes_the_leader_epoch_when_asked() -> None:
    patched = patch_base_offsets(chunk_of(1, 1), 0, partition_leader_epoch=12)

    assert [read_header(patched, p).partition_leader_epoch for p in (0, len(patched) // 2)] == [
        12,
        12,
    ]


def test_patching_into_a_buffer_returns_the_next_offset() -> None:
    chunk = chunk_of(2, 3)
    buffer = bytearray(b"\xee" * 10 + chunk + b"\xee" * 10)

    next_offset = patch_base_offsets_into(buffer, 10, 10 + len(chunk), 1000)

    assert next_offset == 1005
    assert kafka_python_offsets(buffer[10:-10]) == [[1000, 1001], [1002, 1003, 1004]]
    assert buffer[:10] == buffer[-10:] == b"\xee" * 10


def test_patching_refuses_a_batch_with_a_bad_crc() -> None:
    chunk = bytearray(chunk_of(2, 3))
    chunk[-1] ^= 0x01

    with pytest.raises(CorruptDataError, match="CRC"):
        patch_base_offsets(chunk, 0)


def test_patching_without_crc_check_skips_it() -> None:
    chunk = bytearray(chunk_of(2))
    chunk[-1] ^= 0x01

    assert read_header(patch_base_offsets(chunk, 9, verify_crc=False)).base_offset == 9


def test_patching_refuses_a_chunk_that_ends_inside_a_batch() -> None:
    with pytest.raises(CorruptDataError):
        patch_base_offsets(chunk_of(2, 3)[:-5], 0)


@given(st.binary(max_size=300), st.booleans())
def test_patching_random_bytes_raises_only_corrupt_data_error(data: bytes, verify: bool) -> None:
    with contextlib.suppress(CorruptDataError):
        patch_base_offsets(data, 0, verify_crc=verify)


def test_large_batches_validate_and_patch() -> None:
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, LIMIT)
    for i in range(15):
        builder.append(i, T0, None, os.urandom(1024), [])
    chunk = bytes(builder.build()) * 4

    infos = split_and_validate(chunk, max_batch_bytes=LIMIT)

    assert sum(info.record_count for info in infos) == 60
    assert kafka_python_offsets(patch_base_offsets(chunk, 0))[-1][-1] == 59


def test_a_batch_stamped_with_log_append_time_gives_every_record_that_time() -> None:
    records = [Record(i, 1_000 + i, None, b"v", ()) for i in range(3)]
    stamped = with_log_append_time(build_batch(records, compression=Compression.ZSTD), 5_000)

    header, decoded = decode_batch(stamped)  # verifies the recomputed CRC
    assert header.attributes & 0x08
    assert header.max_timestamp == 5_000
    assert [r.timestamp for r in decoded] == [5_000, 5_000, 5_000]
    assert [r.value for r in decoded] == [b"v", b"v", b"v"]
