"""The bounded queue of events behind a :class:`~icefloe.ports.metadata.Watch`.

A watch buffers the changes its consumer has not taken yet. The buffer must be bounded (a slow
or stuck consumer must not grow the process's memory without end), yet the port's contract
forbids missing a change silently. :class:`WatchQueue` holds at most ``limit`` events; when one
more arrives it drops them all and holds a single ``RESET`` instead, which tells the consumer
to re-read what it cares about — a re-read that sees every dropped change. A ``RESET`` queued
for any other reason (a broken stream, compacted history) drops the queued events likewise:
they would be re-read anyway.

It is an object the watch holds, not a base class: each adapter's watch is fed its own way (a
pump polling a database, gRPC streams followed by tasks) and keeps its own state and
``close()``; all of them hand events to the queue and answer
:meth:`~icefloe.ports.metadata.Watch.next_event` from it.

Everything here runs on the event loop thread: no locking.
"""

from __future__ import annotations

import asyncio
from collections import deque

from icefloe.ports.metadata import RESET, EventKind, WatchEvent


class WatchQueue:
    """Undelivered events of one watch: at most ``limit``, then one ``RESET`` instead."""

    def __init__(self, limit: int) -> None:
        """
        Args:
            limit: The most events held; one more turns them all into a single ``RESET``.
        """
        self._limit = limit
        self._events: deque[WatchEvent] = deque()
        self._ready = asyncio.Event()
        self._closed = False

    @property
    def closed(self) -> bool:
        """``True`` once :meth:`close` has run: the watch is over."""
        return self._closed

    def put(self, event: WatchEvent) -> bool:
        """Queue ``event`` for the consumer (nothing once closed).

        A ``RESET`` event, or any event that finds the queue full, empties the queue and leaves
        a single ``RESET`` in it.

        Returns:
            ``True`` if ``event`` itself was queued; ``False`` if a ``RESET`` stands in its
            place (or the queue is closed), so that a caller feeding changes in batches can
            skip the rest of the batch, which the ``RESET`` covers.
        """
        if self._closed:
            return False
        if event.kind is EventKind.RESET or len(self._events) >= self._limit:
            self.reset()
            return False
        self._events.append(event)
        self._ready.set()
        return True

    def reset(self) -> None:
        """Replace the queued events by one ``RESET`` (nothing once closed)."""
        if self._closed:
            return
        # Undelivered events are dropped with the memory they hold: RESET makes the watcher
        # re-read anyway, and the re-read sees them.
        self._events.clear()
        self._events.append(RESET)
        self._ready.set()

    async def get(self) -> WatchEvent | None:
        """Wait for the next event; ``None`` once the queue is closed (also while waiting)."""
        while not self._closed:
            if self._events:
                return self._events.popleft()
            self._ready.clear()
            await self._ready.wait()
        return None

    def close(self) -> None:
        """Drop the queued events and end :meth:`get`, now and for every later call."""
        self._closed = True
        self._events.clear()
        self._ready.set()
