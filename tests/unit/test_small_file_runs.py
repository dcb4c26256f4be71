"""Which data files table maintenance merges: runs of consecutive small files of a stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from icefloe.compaction.maintenance import small_run
from icefloe.storage.index import IndexEntry, Location, ParquetLocation, WalLocation


def entry(start: int, end: int, size: int, *, wal: bool = False) -> IndexEntry:
    location: Location = (
        WalLocation("wal-object", 0, size)
        if wal
        else ParquetLocation(f"f-{start}-{end}.parquet", size, ((start, end - 1),))
    )
    return IndexEntry(1, end, 0, end - start, location, 0, 0, 0, ())


async def listed(entries: Sequence[IndexEntry]) -> AsyncIterator[IndexEntry]:
    for e in entries:
        yield e


async def run_of(entries: Sequence[IndexEntry], target: int, min_files: int) -> list[int]:
    """The start offsets of the chosen run."""
    return [e.start for e in await small_run(listed(entries), target, min_files)]


async def test_consecutive_small_files_form_a_run() -> None:
    files = [entry(i * 10, i * 10 + 10, 100) for i in range(4)]
    assert await run_of(files, 1000, 3) == [0, 10, 20, 30]


async def test_too_few_small_files_make_no_run() -> None:
    files = [entry(0, 10, 100), entry(10, 20, 100)]
    assert await run_of(files, 1000, 3) == []


async def test_a_large_file_breaks_a_run() -> None:
    files = [
        entry(0, 10, 100),
        entry(10, 20, 100),
        entry(20, 30, 900),  # 90% of the target: not small
        entry(30, 40, 100),
        entry(40, 50, 100),
        entry(50, 60, 100),
    ]
    assert await run_of(files, 1000, 3) == [30, 40, 50]


async def test_a_run_stops_at_the_target_size() -> None:
    files = [entry(i * 10, i * 10 + 10, 300) for i in range(5)]
    assert await run_of(files, 1000, 2) == [0, 10, 20]


async def test_a_gap_in_offsets_breaks_a_run() -> None:
    files = [entry(0, 10, 100), entry(10, 20, 100), entry(25, 30, 100), entry(30, 40, 100)]
    assert await run_of(files, 1000, 3) == []


async def test_a_merged_file_waits_for_as_many_bytes_of_newer_files() -> None:
    merged = entry(0, 70, 700)
    newer = [entry(70 + i * 10, 80 + i * 10, 100) for i in range(8)]
    # 700 + 6 × 100: the merged file would be more than half the run; the 6 alone are too few.
    assert await run_of([merged, *newer[:6]], 10_000, 3) == [70, 80, 90, 100, 110, 120]
    assert await run_of([merged, *newer[:6]], 10_000, 8) == []
    # 700 + 7 × 100: now the merged file is half the run, and they merge together.
    assert await run_of([merged, *newer[:7]], 10_000, 8) == [0, *range(70, 140, 10)]


async def test_wal_entries_are_never_part_of_a_run() -> None:
    files = [entry(0, 10, 100), entry(10, 20, 100), entry(20, 30, 100, wal=True)]
    assert await run_of(files, 1000, 3) == []
    assert await run_of(files, 1000, 2) == [0, 10]
