"""Batches rebuilt from table rows are the batches the producer sent, byte for byte."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icefloe.storage.batch import TimestampType, read_header
from icefloe.storage.parquet import RowBuilder
from icefloe.storage.rebuild import _writable, rebuild_batches, rebuild_group, rebuild_groups
from icefloe.storage.records import Record, build_batch, decode_batch
from tests.support.kafka_wire import batch_with_deltas
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


@settings(max_examples=200, deadline=None)
@given(st.lists(batch_fields, min_size=1, max_size=6), st.integers(0, 2**40))
def test_rebuilt_batches_equal_the_sent_ones(specs, first_offset: int) -> None:  # type: ignore[no-untyped-def]
    sent = sent_batches(specs, first_offset)
    rows = RowBuilder(partition=3)
    for base, batch in sent:
        rows.add_batch(batch, base)

    assert rebuild_batches(rows.table()) == b"".join(batch for _, batch in sent)


@settings(max_examples=50, deadline=None)
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


def test_records_whose_offsets_leave_their_batch_keep_offsets_of_their_own_batch() -> None:
    """Offset deltas that go back or reach past the batch (a hostile producer's: produce
    validation reads headers only) are numbered by position, so no row takes another batch's
    offset and the rebuilt batch moves a consumer on; deltas with gaps are kept."""
    rows = RowBuilder(partition=0)
    rows.add_batch(build_batch([Record(0, T0, None, b"a")]), 9)
    rows.add_batch(batch_with_deltas([(0, -1), (0, 7)], T0), 10)  # offsets 9 and 17 as sent
    rows.add_batch(build_batch([Record(12, T0, None, b"g"), Record(14, T0, None, b"h")],
                               base_offset=12), 12)  # fmt: skip

    table = rows.table()
    rebuilt = rebuild_batches(table)

    assert table.column("offset").to_pylist() == [9, 10, 11, 12, 14]
    position, offsets = 0, []
    while position < len(rebuilt):
        header, records = decode_batch(
            rebuilt[position : position + read_header(rebuilt, position).size]
        )
        assert header.last_offset_delta >= 0
        offsets += [r.offset for r in records]
        position += header.size
    assert offsets == [9, 10, 11, 12, 14]


@pytest.mark.parametrize(
    ("offsets", "bases", "problem"),
    [
        ([5, 4, 6], [4, 4, 4], "rise"),  # out of order
        ([5, 5, 6], [5, 5, 5], "rise"),  # repeated
        ([5, 6, 7], [5, 7, 7], "before its batch"),  # a row before its batch's base offset
        ([5, 6, 2**31 + 5], [5, 5, 5], "reach past"),  # more than a batch's offsets reach
    ],
)
def test_rows_that_could_not_come_from_batches_are_refused(
    offsets: list[int], bases: list[int], problem: str
) -> None:
    """A data file changed in storage: refused (the reader answers it corrupt), not rebuilt
    into batches that a consumer refuses or that move it backwards."""
    rows = RowBuilder(partition=0)
    rows.add_batch(build_batch([Record(i, T0, None, b"v") for i in range(3)]), 5)
    table = rows.table()
    for name, values in (("offset", offsets), ("batch_base_offset", bases)):
        index = table.schema.get_field_index(name)
        table = table.set_column(index, table.schema.field(index), [values])

    with pytest.raises(ValueError, match=problem):
        rebuild_batches(table)


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


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(batch_fields, st.integers(0, 3)), min_size=1, max_size=6),
    st.integers(0, 2**40),
    st.lists(st.integers(0, 80), max_size=4),
    st.none() | st.integers(0, 5),
)
def test_groups_rebuilt_together_are_the_groups_rebuilt_one_by_one(  # type: ignore[no-untyped-def]
    specs, first_offset, cuts, past
) -> None:
    """Whatever the cuts: at batches' starts (as data files have them), inside a batch (rows of
    one batch in two groups rebuild as two batches), or making groups of no rows; and with
    gaps between batches, as log compaction leaves them."""
    rows = RowBuilder(partition=0)
    offset = first_offset
    for spec, gap in specs:
        [(base, batch)] = sent_batches([spec], offset)
        rows.add_batch(batch, base)
        offset = rows.table().column("offset")[-1].as_py() + 1 + gap
    table = rows.table()
    bounds = [0, *sorted(min(cut, table.num_rows) for cut in cuts), table.num_rows]
    end = None if past is None else table.column("offset")[-1].as_py() + 1 + past
    group_rows = [after - start for start, after in itertools.pairwise(bounds)]

    together = rebuild_groups(table, group_rows, end_offset=end)

    one_by_one = [
        rebuild_group(
            table.slice(start, after - start), end_offset=end if after == table.num_rows else None
        )
        for start, after in itertools.pairwise(bounds)
    ]
    assert [(bytes(g.data), g.positions, g.next_offsets) for g in together] == [
        (bytes(g.data), g.positions, g.next_offsets) for g in one_by_one
    ]


def test_a_group_rebuilt_with_the_next_ends_where_it_would_alone() -> None:
    """A batch that ends a group reaches to its own last record, as when the group is rebuilt
    alone, not up to the next group's first batch after a gap that log compaction left."""
    rows = RowBuilder(partition=0)
    rows.add_batch(build_batch([Record(0, T0, None, b"v"), Record(1, T0, None, b"w")]), 0)
    rows.add_batch(build_batch([Record(5, T0, None, b"x")], base_offset=5), 5)

    first, second = rebuild_groups(rows.table(), [2, 1])

    assert first.next_offsets == [2]
    assert second.next_offsets == [6]
    assert rebuild_groups(rows.table(), [3])[0].next_offsets == [5, 6]  # one group: to the next


def test_group_rows_must_add_up_to_the_table() -> None:
    rows = RowBuilder(partition=0)
    rows.add_batch(build_batch([Record(0, T0, None, b"v"), Record(1, T0, None, b"w")]), 0)

    with pytest.raises(ValueError, match="row groups of 3 rows in a table of 2"):
        rebuild_groups(rows.table(), [1, 2])


def test_a_read_only_buffer_is_copied_to_be_written() -> None:
    view = _writable(pa.py_buffer(b"abc"))  # a buffer over bytes: read-only

    view[0] = ord("x")

    assert bytes(view) == b"xbc"
