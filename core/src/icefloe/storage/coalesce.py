"""Reads of one WAL object asked for together become one ranged read of the span they cover.

A WAL object holds chunks of many streams side by side. A consumer of several partitions of a
topic (or several consumers at once) wants chunks of the same objects at the same moment, and
on an object store each ranged read is a request: billed, and a round trip. Reads of one
object started in the same turn of the event loop are therefore gathered, and ranges that lie
close together (within ``max_gap`` bytes) are read as one; each caller gets a view of its part.
A read asked for alone is read as asked: nothing is read ahead of need.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

from icefloe.ports.wal import WAL

DEFAULT_MAX_GAP: Final = 1 << 20
"""Bytes no caller asked for that one read may carry between two wanted ranges: beyond it, two
reads cost less than the bytes between them."""


@dataclass(eq=False, slots=True)
class _Wanted:
    start: int
    end: int
    result: asyncio.Future[bytes | memoryview]


@dataclass(eq=False, slots=True)
class _Span:
    """Wanted ranges read together: ``[start, end)`` covers them all."""

    start: int
    end: int
    wanted: list[_Wanted] = field(default_factory=list)


class CoalescedReads:
    """Ranged reads of a WAL, gathered per object within one turn of the event loop."""

    def __init__(self, wal: WAL, max_gap: int = DEFAULT_MAX_GAP) -> None:
        self._wal = wal
        self._max_gap = max_gap
        self._gathering: dict[str, list[_Wanted]] = {}
        self._reads: set[asyncio.Task[None]] = set()

    def read(self, ref: str, start: int, end: int) -> asyncio.Future[bytes | memoryview]:
        """Bytes ``[start, end)`` of the object ``ref``, once read; cancelling the future
        drops this caller's interest only (others may share the read)."""
        loop = asyncio.get_running_loop()
        wanted = _Wanted(start, end, loop.create_future())
        gathering = self._gathering.get(ref)
        if gathering is None:
            gathering = self._gathering[ref] = []
            loop.call_soon(self._start, ref)
        gathering.append(wanted)
        return wanted.result

    def _start(self, ref: str) -> None:
        for span in _spans(self._gathering.pop(ref), self._max_gap):
            task = asyncio.ensure_future(self._read_span(ref, span))
            self._reads.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._reads.discard)

    async def _read_span(self, ref: str, span: _Span) -> None:
        if all(w.result.cancelled() for w in span.wanted):
            return
        try:
            data = await self._wal.read(ref, span.start, span.end)
        except asyncio.CancelledError:
            for wanted in span.wanted:
                wanted.result.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - each caller gets the read's error
            for wanted in span.wanted:
                if not wanted.result.done():
                    wanted.result.set_exception(exc)
            return
        view = memoryview(data)
        for wanted in span.wanted:
            if not wanted.result.done():
                wanted.result.set_result(view[wanted.start - span.start : wanted.end - span.start])

    async def close(self) -> None:
        """Cancel the reads in flight (their callers get CancelledError)."""
        for task in list(self._reads):
            task.cancel()
        await asyncio.gather(*self._reads, return_exceptions=True)


def _spans(wanted: list[_Wanted], max_gap: int) -> list[_Span]:
    """The wanted ranges grouped into spans: sorted by start, a range joins the span before
    it if it begins within ``max_gap`` bytes of that span's end."""
    spans: list[_Span] = []
    for item in sorted(wanted, key=lambda w: w.start):
        if spans and item.start - spans[-1].end <= max_gap:
            spans[-1].end = max(spans[-1].end, item.end)
            spans[-1].wanted.append(item)
        else:
            spans.append(_Span(item.start, item.end, [item]))
    return spans
