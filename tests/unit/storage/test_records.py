"""Records inside v2 batches: build, decode, and agreement with kafka-python both ways.

kafka-python ships only gzip here; for snappy, lz4 and zstd the ``kafka_python_codecs``
fixture plugs cramjam into its codec hooks. The cross-checks then still exercise
kafka-python's own batch layout, record encoding and xerial snappy framing, while the
compression primitives on both sides are cramjam's.
"""

from __future__ import annotations

import contextlib
import struct
from types import SimpleNamespace

import cramjam
import kafka.codec
import kafka.record.default_records as kafka_records
import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kio.schema.errors import ErrorCode

from icefloe.storage.batch import (
    HEADER_SIZE,
    BatchError,
    Compression,
    TimestampType,
    read_header,
    split_and_validate,
)
from icefloe.storage.parquet import RowBuilder
from icefloe.storage.records import Record, build_batch, decode_batch, empty_batch, recompress
from tests.support.kafka_wire import batch_with_deltas

T0 = 1_700_000_000_123

SAMPLE = [
    Record(0, T0, None, None),
    Record(1, T0 + 1, b"", b""),
    Record(2, T0 - 5, bytes(range(256)), b"\x00\xff" * 700, (("a", b"1"), ("a", b"2"))),
    Record(3, T0 + 86_400_001, b"key", None, (("trace", None), ("", b""), ("é", b"\x80"))),
]


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


def kafka_python_read(batch: bytes) -> list[Record]:
    [parsed] = list(MemoryRecords(batch))
    assert parsed.validate_crc()
    return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


def kafka_python_build(records: list[Record], compression: Compression) -> bytes:
    builder = DefaultRecordBatchBuilder(2, int(compression), False, -1, -1, -1, 1 << 20)
    for record in records:
        builder.append(
            record.offset, record.timestamp, record.key, record.value, list(record.headers)
        )
    return bytes(builder.build())


# --- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("compression", list(Compression))
def test_round_trip_keeps_every_field(compression: Compression) -> None:
    header, records = decode_batch(build_batch(SAMPLE, compression=compression))

    assert records == SAMPLE
    assert header.compression is compression


@pytest.mark.parametrize("compression", list(Compression))
def test_built_batch_passes_produce_validation(compression: Compression) -> None:
    batch = build_batch(SAMPLE, compression=compression)

    [info] = split_and_validate(batch, max_batch_bytes=1 << 20)

    assert (info.record_count, info.base_timestamp, info.max_timestamp) == (
        4,
        T0,
        T0 + 86_400_001,
    )


def test_timestamps_keep_millisecond_precision() -> None:
    records = [Record(0, 1_234_567_890_987, None, b"x"), Record(1, 1_234_567_890_988, None, b"y")]

    assert [r.timestamp for r in decode_batch(build_batch(records))[1]] == [
        1_234_567_890_987,
        1_234_567_890_988,
    ]


def test_build_writes_producer_fields_and_base_offset() -> None:
    records = [Record(500, T0, None, b"v"), Record(501, T0, None, b"w")]

    header, decoded = decode_batch(
        build_batch(
            records,
            base_offset=500,
            producer_id=77,
            producer_epoch=3,
            base_sequence=11,
            is_transactional=True,
        )
    )

    assert decoded == records
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 11)
    assert header.is_transactional
    assert header.last_offset_delta == 1


def test_offset_gaps_are_kept() -> None:
    records = [Record(10, T0, None, b"a"), Record(13, T0, None, b"b")]

    header, decoded = decode_batch(build_batch(records, base_offset=10))

    assert decoded == records
    assert (header.last_offset_delta, header.record_count) == (3, 2)


def test_decode_with_a_base_offset_numbers_unpatched_bytes() -> None:
    records = [Record(i, T0, None, b"v") for i in range(3)]

    _, decoded = decode_batch(build_batch(records), base_offset=1000)

    assert [r.offset for r in decoded] == [1000, 1001, 1002]


def test_log_append_time_batches_read_back_the_batch_time() -> None:
    records = [Record(0, T0, None, b"a"), Record(1, T0 + 50, None, b"b")]

    header, decoded = decode_batch(
        build_batch(records, timestamp_type=TimestampType.LOG_APPEND_TIME)
    )

    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert [r.timestamp for r in decoded] == [T0 + 50, T0 + 50]


def test_build_refuses_no_records() -> None:
    with pytest.raises(ValueError, match="at least one"):
        build_batch([])


def test_build_refuses_offsets_that_do_not_increase() -> None:
    with pytest.raises(ValueError, match="offset"):
        build_batch([Record(1, T0, None, None), Record(1, T0, None, None)], base_offset=0)


def test_build_refuses_a_header_field_out_of_range() -> None:
    with pytest.raises(ValueError, match="out of range"):
        build_batch([Record(0, T0, None, None)], producer_epoch=2**15)


def test_build_refuses_an_offset_before_the_base_offset() -> None:
    with pytest.raises(ValueError, match="offset"):
        build_batch([Record(4, T0, None, None)], base_offset=5)


def test_an_empty_batch_holds_no_record_and_reaches_the_end_of_its_offsets() -> None:
    batch = empty_batch(40, 47)
    header, records = decode_batch(batch)
    assert records == []
    assert (header.base_offset, header.last_offset_delta, header.record_count) == (40, 6, 0)
    assert (header.is_transactional, header.is_control) == (False, False)
    assert header.producer_id == -1
    [parsed] = list(MemoryRecords(batch))  # a client reads it too, and moves on to 47
    assert parsed.validate_crc()
    assert (list(parsed), parsed.next_offset) == ([], 47)


def test_an_empty_batch_covers_at_least_one_offset() -> None:
    with pytest.raises(ValueError, match=r"\[5, 5\)"):
        empty_batch(5, 5)


# --- agreement with kafka-python ------------------------------------------------------------


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("compression", list(Compression))
def test_kafka_python_reads_what_we_build(compression: Compression) -> None:
    assert kafka_python_read(build_batch(SAMPLE, compression=compression)) == SAMPLE


@pytest.mark.usefixtures("kafka_python_codecs")
@pytest.mark.parametrize("compression", list(Compression))
def test_we_read_what_kafka_python_builds(compression: Compression) -> None:
    records = [*SAMPLE, *(Record(i, T0 + i, b"k", b"v" * 200) for i in range(4, 40))]
    batch = kafka_python_build(records, compression)
    assert read_header(batch).compression is compression  # kafka-python did compress

    assert decode_batch(batch)[1] == records


def test_snappy_batches_use_the_xerial_framing_java_clients_write() -> None:
    batch = build_batch(SAMPLE, compression=Compression.SNAPPY)

    assert batch[HEADER_SIZE : HEADER_SIZE + 16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


def test_raw_snappy_as_librdkafka_writes_it_is_read() -> None:
    plain = build_batch(SAMPLE)
    body = bytes(cramjam.snappy.compress_raw(plain[HEADER_SIZE:]))
    batch = bytearray(plain[:HEADER_SIZE] + body)
    struct.pack_into(">ih", batch, 8, len(batch) - 12, 0)
    struct.pack_into(">h", batch, 21, int(Compression.SNAPPY))
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))

    assert decode_batch(bytes(batch))[1] == SAMPLE


def test_lz4_batches_use_independent_blocks_as_java_requires() -> None:
    batch = build_batch(SAMPLE, compression=Compression.LZ4)
    frame = batch[HEADER_SIZE:]

    assert frame[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    assert frame[4] & 0x20  # FLG block-independence bit


# --- malformed input -------------------------------------------------------------------------


def test_flipped_record_byte_fails_the_crc_check() -> None:
    batch = bytearray(build_batch(SAMPLE))
    batch[-3] ^= 0x10

    with pytest.raises(BatchError, match="CRC") as caught:
        decode_batch(bytes(batch))
    assert caught.value.error_code is ErrorCode.corrupt_message


def test_trailing_bytes_after_the_records_are_corrupt() -> None:
    plain = build_batch([Record(0, T0, None, b"v")])
    batch = bytearray(plain + b"\x00")
    struct.pack_into(">i", batch, 8, len(batch) - 12)

    with pytest.raises(BatchError, match="follow"):
        decode_batch(bytes(batch), verify_crc=False)


def test_decompressed_size_over_the_limit_is_refused() -> None:
    records = [Record(i, T0, None, b"\x00" * 10_000) for i in range(10)]

    for compression in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        batch = build_batch(records, compression=compression)
        with pytest.raises(BatchError, match="expand"):
            decode_batch(batch, max_uncompressed_bytes=50_000)


def test_unknown_codec_is_unsupported_compression_type() -> None:
    batch = bytearray(build_batch(SAMPLE))
    struct.pack_into(">h", batch, 21, 6)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))

    with pytest.raises(BatchError) as caught:
        decode_batch(bytes(batch))
    assert caught.value.error_code is ErrorCode.unsupported_compression_type


def test_recompressing_records_whose_offsets_are_not_consecutive_is_invalid_record() -> None:
    sent = batch_with_deltas([(0, 1), (0, 1)])  # what Kafka calls not incremental

    with pytest.raises(BatchError, match="consecutive offsets") as caught:
        recompress(sent, Compression.ZSTD)
    assert caught.value.error_code is ErrorCode.invalid_record


def test_recompressing_records_too_far_apart_in_time_is_invalid_timestamp() -> None:
    sent = batch_with_deltas([(-(2**63), 0), (2**63 - 1, 1)])

    with pytest.raises(BatchError, match="too far") as caught:
        recompress(sent, Compression.LZ4)
    assert caught.value.error_code is ErrorCode.invalid_timestamp


@pytest.mark.xfail(
    strict=True,
    reason="the produce path checks batch headers and CRCs, never records: a batch whose "
    "compressed records do not decompress is stored, and compaction fails on it at every try "
    "(Kafka refuses it CORRUPT_MESSAGE on produce)",
)
def test_a_batch_the_produce_path_accepts_is_one_compaction_decodes() -> None:
    sent = bytearray(build_batch(SAMPLE, compression=Compression.ZSTD))
    sent[HEADER_SIZE + 10 :] = b"\xaa" * (len(sent) - HEADER_SIZE - 10)
    struct.pack_into(">I", sent, 17, crc32c(memoryview(sent)[21:]))
    split_and_validate(bytes(sent), max_batch_bytes=1 << 20)  # accepted

    rows = RowBuilder(partition=0)
    rows.add_batch(bytes(sent), 0)
    assert rows.table().num_rows == len(SAMPLE)


def test_garbage_compressed_payload_is_corrupt() -> None:
    batch = bytearray(build_batch(SAMPLE, compression=Compression.ZSTD))
    batch[HEADER_SIZE + 10 :] = b"\xaa" * (len(batch) - HEADER_SIZE - 10)
    struct.pack_into(">I", batch, 17, crc32c(memoryview(batch)[21:]))

    with pytest.raises(BatchError, match="decompress"):
        decode_batch(bytes(batch))


# --- properties ------------------------------------------------------------------------------

header_strategy = st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8))
record_fields = st.tuples(
    st.integers(-(2**40), 2**40),
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(header_strategy, max_size=3).map(tuple),
)


@settings(max_examples=150)
@given(
    st.lists(record_fields, min_size=1, max_size=20),
    st.sampled_from(list(Compression)),
    st.integers(0, 2**40),
    st.lists(st.integers(1, 3), min_size=20, max_size=20),
)
def test_any_records_round_trip(
    fields: list[tuple[int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]],
    compression: Compression,
    base_offset: int,
    gaps: list[int],
) -> None:
    offsets = [base_offset]
    for gap in gaps[: len(fields) - 1]:
        offsets.append(offsets[-1] + gap)
    records = [
        Record(offset, T0 + delta, key, value, headers)
        for offset, (delta, key, value, headers) in zip(offsets, fields, strict=True)
    ]

    batch = build_batch(records, compression=compression, base_offset=base_offset)

    assert decode_batch(batch)[1] == records


@given(st.binary(max_size=400), st.booleans())
def test_random_bytes_raise_only_batch_error(data: bytes, verify: bool) -> None:
    with contextlib.suppress(BatchError):
        decode_batch(data, verify_crc=verify)


PLAIN = build_batch(SAMPLE)
SNAPPY = build_batch(SAMPLE, compression=Compression.SNAPPY)


@given(
    st.sampled_from([PLAIN, SNAPPY]),
    st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 255)), min_size=1, max_size=4),
    st.integers(0, 5000),
)
def test_mutated_batches_raise_only_batch_error(
    batch: bytes, flips: list[tuple[int, int]], cut: int
) -> None:
    """Without the CRC check, every mutation reaches the record parser or the codec."""
    mutated = bytearray(batch)
    for position, mask in flips:
        mutated[position % len(mutated)] ^= mask
    del mutated[max(cut, HEADER_SIZE) :]
    with contextlib.suppress(BatchError):
        decode_batch(bytes(mutated), verify_crc=False)


@given(
    st.integers(HEADER_SIZE, len(PLAIN) - 1),
    st.integers(1, 255),
)
def test_mutated_record_bytes_with_fixed_length_raise_only_batch_error(
    position: int, mask: int
) -> None:
    """Flips that keep the batch length intact exercise the record loop itself."""
    mutated = bytearray(PLAIN)
    mutated[position] ^= mask
    with contextlib.suppress(BatchError):
        decode_batch(bytes(mutated), verify_crc=False)
