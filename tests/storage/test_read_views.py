"""Read parts are kept in the buffers they were read into only where their holder (a fetch
response) uses most of such a buffer: otherwise it would hold memory the broker's budget does
not count."""

from __future__ import annotations

from icefloe.storage.reader import Buffer, copy_small_views, joined


def test_views_of_a_buffer_the_response_mostly_uses_are_sent_from_it() -> None:
    span = memoryview(bytearray(b"a" * 60 + b"b" * 40))  # one read for two partitions
    first, second = span[:60], span[60:]
    partitions: list[list[Buffer]] = [[first], [second]]

    copy_small_views(partitions)

    assert partitions[0][0] is first
    assert partitions[1][0] is second


def test_a_small_view_of_a_large_buffer_is_copied() -> None:
    span = memoryview(bytearray(b"a" * 10 + b"b" * 90))
    small = span[:10]
    plain = b"plain bytes"
    partitions: list[list[Buffer]] = [[small, plain]]

    copy_small_views(partitions)

    copied, kept = partitions[0]
    assert not isinstance(copied, memoryview)
    assert copied == b"a" * 10
    assert kept is plain


def test_one_partitions_views_count_together() -> None:
    span = memoryview(bytearray(100))
    halves = [span[i : i + 25] for i in range(0, 50, 25)]
    partitions: list[list[Buffer]] = [list(halves)]

    copy_small_views(partitions)

    assert all(part is view for part, view in zip(partitions[0], halves, strict=True))


def test_a_lone_part_is_joined_as_it_is_unless_it_is_a_small_view() -> None:
    whole = memoryview(bytearray(b"w" * 10))
    small = memoryview(bytearray(b"s" * 100))[:10]

    assert joined([whole]) is whole
    assert joined([small]) == b"s" * 10
    assert not isinstance(joined([small]), memoryview)
    assert joined([b"a", b"b"]) == b"ab"
