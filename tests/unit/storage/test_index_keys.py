"""Index keys: what :func:`keys.index_key` writes, :func:`keys.parse_index_key` reads back."""

from __future__ import annotations

import pytest

from icefloe.storage import keys


@pytest.mark.parametrize(
    ("stream_id", "end", "cumulative"), [(0, 0, 0), (7, 126, 130_280), (10**11, 2**62, 2**63 - 1)]
)
def test_an_index_key_reads_back_as_written(stream_id: int, end: int, cumulative: int) -> None:
    assert keys.parse_index_key(keys.index_key(stream_id, end, cumulative)) == (
        stream_id,
        end,
        cumulative,
    )


@pytest.mark.parametrize(
    "key",
    [
        "streams/000000000007/log-start",
        "streams/000000000007/index-00000000000000000126",
        "streams/000000000007/index-1-2-3",
        "streams/000000000007/index-1-x",
        "streams/x/index-1-2",
        "index-1-2",
    ],
)
def test_a_key_that_is_not_an_index_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError, match="is not an index key"):
        keys.parse_index_key(key)
