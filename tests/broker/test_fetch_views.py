"""A fetch response sends parts from the buffers they were read into only where the response
uses most of such a buffer: otherwise it would hold memory the broker's budget does not count."""

from __future__ import annotations

from icefloe.broker.handlers.fetch import _Partition, copy_small_views


def partition(index: int, *parts: bytes | memoryview) -> _Partition:
    target = _Partition("t", index, fetch_offset=0, max_bytes=1 << 20)
    target.parts = list(parts)
    target.size = sum(len(part) for part in parts)
    return target


def test_views_of_a_buffer_the_response_mostly_uses_are_sent_from_it() -> None:
    span = memoryview(bytearray(b"a" * 60 + b"b" * 40))  # one read for two partitions
    first, second = span[:60], span[60:]
    targets = [partition(0, first), partition(1, second)]

    copy_small_views(targets)

    assert targets[0].parts[0] is first
    assert targets[1].parts[0] is second


def test_a_small_view_of_a_large_buffer_is_copied() -> None:
    span = memoryview(bytearray(b"a" * 10 + b"b" * 90))
    small = span[:10]
    plain = b"plain bytes"
    targets = [partition(0, small, plain)]

    copy_small_views(targets)

    copied, kept = targets[0].parts
    assert not isinstance(copied, memoryview)
    assert copied == b"a" * 10
    assert kept is plain


def test_one_partitions_views_count_together() -> None:
    span = memoryview(bytearray(100))
    halves = [span[i : i + 25] for i in range(0, 50, 25)]
    targets = [partition(0, *halves)]

    copy_small_views(targets)

    assert all(part is view for part, view in zip(targets[0].parts, halves, strict=True))
