"""Batches rebuilt from table rows are the batches the producer sent, byte for byte."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from icefloe.storage.batch import TimestampType
from icefloe.storage.parquet import RowBuilder
from icefloe.storage.rebuild import rebuild_batches, rebuild_group
from icefloe.storage.records import Record, build_batch, decode_batch
from tests.support.rebuilt_groups import parsed_group

T0 = 1_700_000_000_000

header = st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8))
record_fields = st.tuples(
    st.integers(-(2**40), 2**40),  # timestamp delta, negative ones included
    st.integers(1, 3),  # offset step: gaps as in a compacted log
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(header, max_size=3).map(tuple),
)
batch_fields = st.tuples(
    st.lists(record_fields, min_size=1, max_size=12),
    st.sampled_from([(-1, -1, -1), (7, 0, 0), (2**40, 3, 2**31 - 20)]),
    st.just(TimestampType.CREATE_TIME),
    st.booleans(),
)


def sent_batches(
    specs: list[
        tuple[
            list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]],
            tuple[int, int, int],
            TimestampType,
            bool,
        ]
    ],
    first_offset: int,
) -> list[tuple[int, bytes]]:
    """(base offset, batch) of each spec, at consecutive offsets from ``first_offset``."""
    out = []
    offset = first_offset
    for fields, (producer_id, epoch, sequence), timestamp_type, transactional in specs:
        records = []
        for i, (delta, step, key, value, headers) in enumerate(fields):
            offset += step if i else 0
            records.append(Record(offset, T0 + delta, key, value, headers))
        batch = build_batch(
            records,
            base_offset=records[0].offset,
            producer_id=producer_id,
            producer_epoch=epoch,
            base_sequence=sequence,
            timestamp_type=timestamp_type,
            is_transactional=transactional,
        )
        out.append((records[0].offset, batch))
        offset += 1
    return out


@settings(max_examples=200)
@given(st.lists(batch_fields, min_size=1, max_size=6), st.integers(0, 2**40))
def test_rebuilt_batches_equal_the_sent_ones(specs, first_offset: int) -> None:  # type: ignore[no-untyped-def]
    sent = sent_batches(specs, first_offset)
    rows = RowBuilder(partition=3)
    for base, batch in sent:
        rows.add_batch(batch, base)

    assert rebuild_batches(rows.table()) == b"".join(batch for _, batch in sent)


@settings(max_examples=50)
@given(st.lists(batch_fields, min_size=1, max_size=6), st.integers(0, 2**40), st.integers(0, 5))
def test_a_rebuilt_group_knows_where_its_batches_start_and_end(specs, first_offset, past) -> None:  # type: ignore[no-untyped-def]
    rows = RowBuilder(partition=0)
    for base, batch in sent_batches(specs, first_offset):
        rows.add_batch(batch, base)
    table = rows.table()
    end = table.column("offset")[-1].as_py() + 1 + past  # a file may end past its last row

    group = rebuild_group(table, end_offset=end)

    assert group == parsed_group(group.data)
    assert group.next_offsets[-1] == end


def test_a_slice_of_whole_batches_rebuilds_those_batches() -> None:
    sent = [
        (
            10 * n,
            build_batch(
                [Record(10 * n + i, T0 + i, b"k", b"v" * n) for i in range(10)], base_offset=10 * n
            ),
        )
        for n in range(5)
    ]
    rows = RowBuilder(partition=0)
    for base, batch in sent:
        rows.add_batch(batch, base)

    assert rebuild_batches(rows.table().slice(20, 20)) == sent[2][1] + sent[3][1]


def test_log_append_time_batches_read_back_as_consumers_read_the_sent_ones() -> None:
    # Kafka gives every record of such a batch its max timestamp, so the bytes may differ.
    records = [Record(i, T0 + 5 * i, b"k", b"v") for i in range(4)]
    sent = build_batch(records, timestamp_type=TimestampType.LOG_APPEND_TIME)
    rows = RowBuilder(partition=0)
    rows.add_batch(sent, 0)

    rebuilt = rebuild_batches(rows.table())

    header, read = decode_batch(rebuilt)
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert read == decode_batch(sent)[1]


def test_no_rows_rebuild_nothing() -> None:
    assert rebuild_batches(RowBuilder(partition=0).table()) == b""
