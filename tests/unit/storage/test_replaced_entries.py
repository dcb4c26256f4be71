"""Which replaced WAL entries a read may use, and how many the index cache keeps."""

from __future__ import annotations

import time

import pytest

from icefloe.ports.metadata import EventKind, WatchEvent
from icefloe.storage import keys
from icefloe.storage.index import IndexEntry, ParquetLocation, WalLocation
from icefloe.storage.index_reader import IndexReader
from icefloe.storage.replaced import ReplacedWalEntries

STREAM = 3


def wal(start: int, end: int) -> IndexEntry:
    return IndexEntry(
        STREAM, end, end * 10, end - start, WalLocation(f"w{end}", 0, 10), 0, 0, 0, ()
    )


def data_file(start: int, end: int, name: str = "f") -> IndexEntry:
    location = ParquetLocation(f"{name}.parquet", 100, ((start, end - 1),))
    return IndexEntry(STREAM, end, end * 10, end - start, location, 0, 0, 0, ())


def swapped_0_to_30() -> ReplacedWalEntries:
    """WAL entries [0, 10), [10, 20), [20, 30) replaced by one data file written as version 7,
    notified as a swap does: the put over the last entry, then the deletes, last to first."""
    kept = ReplacedWalEntries(keep_s=60)
    kept.swapped(wal(20, 30), version=7)
    kept.deleted(wal(10, 20))
    kept.deleted(wal(0, 10))
    return kept


def test_an_offset_of_the_swapped_range_finds_its_wal_entry() -> None:
    kept = swapped_0_to_30()
    assert len(kept) == 3
    assert kept.find(0, data_file(0, 30), 7) == wal(0, 10)
    assert kept.find(15, data_file(0, 30), 7) == wal(10, 20)
    assert kept.find(29, data_file(0, 30), 7) == wal(20, 30)


def test_a_data_file_record_of_another_version_finds_none() -> None:
    """Log compaction, maintenance or retention wrote or removed the data file's record."""
    assert swapped_0_to_30().find(15, data_file(0, 30, "cleaned"), 8) is None


def test_a_data_file_under_another_key_finds_none() -> None:
    assert swapped_0_to_30().find(15, data_file(0, 40, "merged"), 7) is None


def test_an_entry_not_wholly_in_the_data_file_is_not_used() -> None:
    kept = ReplacedWalEntries(keep_s=60)
    kept.swapped(wal(20, 30), version=7)
    kept.deleted(wal(10, 20))
    # A time-split swap made [15, 30) a file of its own: [10, 20) straddles it.
    assert kept.find(16, data_file(15, 30), 7) is None
    assert kept.find(25, data_file(15, 30), 7) == wal(20, 30)


def test_deletions_without_a_later_swap_are_not_kept() -> None:
    """Retention deletes entries at the front: no data file will ever hold them."""
    kept = ReplacedWalEntries(keep_s=60)
    kept.deleted(wal(0, 10))
    kept.swapped(wal(20, 30), version=7)
    kept.deleted(wal(30, 40))
    assert len(kept) == 1


def test_a_forgotten_entry_is_not_found_again() -> None:
    kept = swapped_0_to_30()
    kept.forget(wal(10, 20))
    assert kept.find(15, data_file(0, 30), 7) is None
    assert kept.find(5, data_file(0, 30), 7) == wal(0, 10)
    assert len(kept) == 2


def test_entries_expire_after_keep_s() -> None:
    kept = ReplacedWalEntries(keep_s=0.05)
    kept.swapped(wal(20, 30), version=7)
    time.sleep(0.1)
    assert kept.find(25, data_file(0, 30), 7) is None
    assert len(kept) == 0


def test_nothing_is_kept_with_keep_s_zero() -> None:
    kept = ReplacedWalEntries(keep_s=0)
    kept.swapped(wal(20, 30), version=7)
    kept.deleted(wal(10, 20))
    assert len(kept) == 0


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        (4, [wal(0, 10), wal(10, 20), wal(20, 30)]),
        # Three WAL entries and the data file's: the oldest WAL entry was never cached, the
        # first one replaced went when the data file's came.
        (2, [None, wal(10, 20), None]),
    ],
)
async def test_the_index_cache_counts_replaced_entries_and_drops_them_first(
    capacity: int, expected: list[IndexEntry | None]
) -> None:
    reader = IndexReader(metadata=None, cache_entries=capacity, keep_replaced_s=60)  # type: ignore[arg-type]
    for version, entry in enumerate([wal(0, 10), wal(10, 20), wal(20, 30)], start=1):
        reader.remember(entry, version)
    # The swap: the data file's record over the key of [20, 30), then the deletes.
    for end, kind, version in [
        (30, EventKind.PUT, 9),
        (20, EventKind.DELETE, None),
        (10, EventKind.DELETE, None),
    ]:
        await reader._apply(WatchEvent(kind, keys.index_key(STREAM, end, end * 10), version))
    reader.remember(data_file(0, 30), version=9)
    assert reader._cached + len(reader._replaced) == capacity
    assert await reader.entry_for(STREAM, 5) == data_file(0, 30)  # the current entry stays
    assert [reader.replaced(offset, data_file(0, 30)) for offset in (5, 15, 25)] == expected


def test_swaps_are_forgotten_with_the_entries_they_serve() -> None:
    """A stream compacted all day keeps only the swaps of the entries still kept."""
    kept = ReplacedWalEntries(keep_s=60)
    for i in range(1000):
        kept.swapped(wal(10 * i, 10 * i + 10), version=i)
    for _ in range(999):
        kept.drop_oldest()
    assert len(kept) == 1
    assert kept._streams[STREAM].swaps == {10_000: 999}
    assert kept.find(9_995, data_file(9_990, 10_000), 999) == wal(9_990, 10_000)
