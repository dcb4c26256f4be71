"""Index values: :func:`index.decode` and :func:`index.decode_provenance` read what
:func:`index.encode_value` wrote, and refuse what it did not write with CorruptDataError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from icefloe.errors import CorruptDataError
from icefloe.storage import index, keys
from icefloe.storage.index import BatchRef, ProducerBatch, WalLocation

KEY = keys.index_key(3, 120, 4_096)
PRODUCERS = (ProducerBatch(9, 1, 40, 59, 0, 20), ProducerBatch(9, 1, 60, 79, 20, 20))
VALUE = index.encode_value(
    record_count=40,
    location=WalLocation("wal-1", 100, 4_000),
    min_timestamp=1_000,
    max_timestamp=2_000,
    created_ms=3_000,
    batches=(BatchRef(0, 0, 2_000, 20, 1_500), BatchRef(20, 2_000, 2_000, 20, 2_000)),
    producers=PRODUCERS,
)
DECODERS: list[Callable[[str, bytes], Any]] = [index.decode, index.decode_provenance]


def test_provenance_is_what_the_whole_entry_says() -> None:
    entry = index.decode(KEY, VALUE)

    assert index.decode_provenance(KEY, VALUE) == index.Provenance(80, 3_000, PRODUCERS)
    assert (entry.start, entry.created_ms, entry.producers) == (80, 3_000, PRODUCERS)


@pytest.mark.parametrize("decode", DECODERS)
@pytest.mark.parametrize(
    ("key", "value"),
    [
        (KEY, b"\xc1"),  # not msgpack
        (KEY, msgpack.packb([1, 2])),  # not a map
        (KEY, msgpack.packb({"v": 99, "n": 1, "at": 0})),  # a newer format
        (KEY, msgpack.packb({"v": index.FORMAT_VERSION, "at": 0})),  # no record count
        (KEY, msgpack.packb({"v": index.FORMAT_VERSION, "n": 1, "at": 0, "p": [[1]]})),
        ("streams/000000000003/log-start", VALUE),  # not an index key
    ],
)
def test_a_value_it_did_not_write_is_corrupt(
    decode: Callable[[str, bytes], Any], key: str, value: bytes
) -> None:
    with pytest.raises(CorruptDataError, match="index entry"):
        decode(key, value)
