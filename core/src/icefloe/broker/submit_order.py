"""Request order per partition, for the produce requests a client pipelines on one connection.

An idempotent producer may have several produce requests in flight on a connection. The
batches of one partition must reach the stream writer in request order, or their sequence
numbers would look out of order; batches of different partitions need no order between them.
So each request takes its turn per partition: it waits only for the earlier requests that
write the same partition, and the partitions of one request, or of a client that sends one
request per partition (librdkafka), are submitted together, their store round trips (an
idempotent producer claiming its lease on a partition) overlapping instead of adding up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable


class SubmitOrder:
    """One connection's queue of turns per partition."""

    def __init__(self) -> None:
        self._last: dict[Hashable, asyncio.Future[None]] = {}
        """The turn of the latest request that writes each partition, until it is over."""

    def take_turns(self, partitions: Iterable[Hashable]) -> dict[Hashable, Turn]:
        """A turn on each partition, after those of the requests that took theirs earlier.

        Call it before the request's first await: requests take their turns in the order the
        connection starts their handlers, which is request order.
        """
        loop = asyncio.get_running_loop()
        turns = {}
        for partition in partitions:
            mine: asyncio.Future[None] = loop.create_future()
            turns[partition] = Turn(self, partition, self._last.get(partition), mine)
            self._last[partition] = mine
        return turns

    def _over(self, partition: Hashable, turn: asyncio.Future[None]) -> None:
        if not turn.done():
            turn.set_result(None)
        if self._last.get(partition) is turn:
            del self._last[partition]


class Turn:
    """A request's turn on one partition: entering it waits for the earlier turn to end."""

    __slots__ = ("_after", "_mine", "_order", "_partition")

    def __init__(
        self,
        order: SubmitOrder,
        partition: Hashable,
        after: asyncio.Future[None] | None,
        mine: asyncio.Future[None],
    ) -> None:
        self._order = order
        self._partition = partition
        self._after = after
        self._mine = mine

    async def __aenter__(self) -> None:
        """Hold the turn (``async with turn:``); it ends when the block does, however it
        ends."""
        if self._after is not None and not self._after.done():
            try:
                # wait() does not cancel the earlier request's future if this one is cancelled.
                await asyncio.wait((self._after,))
            except BaseException:
                self.end()
                raise

    async def __aexit__(self, *exc_info: object) -> None:
        self.end()

    def end(self) -> None:
        """End the turn, or let it end with the earlier one if that is not over (the request
        was cancelled while it waited, or failed before it used the turn): a later request
        must not overtake the earlier one. Ending a turn twice changes nothing."""
        if self._after is None or self._after.done():
            self._order._over(self._partition, self._mine)
        else:
            self._after.add_done_callback(lambda _: self._order._over(self._partition, self._mine))
