"""One client connection's byte stream: frames received into buffers of their size.

asyncio's ``StreamReader`` copies every byte twice: into its buffer as it arrives, then out of
it for ``readexactly``, and it wakes the reader for every chunk. A produce request is up to
megabytes, and those copies were a fifth of the event loop's time under a fast producer. Here
the transport receives a large read straight into the buffer the caller gets (``recv_into``),
and small reads (size prefixes, small requests) come out of a bounded read-ahead buffer with
one copy. Reading pauses while the read-ahead buffer is full and no read wants its bytes: a
client that sends faster than the broker reads is held back by TCP, not by memory.

Writes go the other way through the transport, which sends what the socket takes at once and
copies the rest into a buffer of its own. A response of megabytes (a catch-up fetch) is handed
over a slice at a time, each once the transport's buffer has drained: what is copied is then
at most a slice, not most of the response, and the response's own buffers are sent from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final, cast

READ_AHEAD_BYTES: Final = 64 << 10
"""The read-ahead buffer of a connection: the most one socket read takes in while no large
read is in progress."""
DIRECT_BYTES: Final = 16 << 10
"""Reads at least this large are received straight into their own buffer."""
WRITE_SLICE_BYTES: Final = 256 << 10
""":meth:`Wire.write_all` hands buffers to the transport at most this much at a time."""


class Wire(asyncio.BufferedProtocol):
    """A connection's reads (:meth:`read_exactly`) and writes (``write``/``drain``), for one
    task that reads and one that writes."""

    def __init__(
        self,
        on_connect: Callable[[Wire], None],
        read_ahead_bytes: int = READ_AHEAD_BYTES,
    ) -> None:
        self._on_connect = on_connect
        self.transport: asyncio.Transport | None = None
        self._ahead = bytearray(read_ahead_bytes)
        self._start = 0
        self._end = 0
        """The unread bytes of the read-ahead buffer are ``[_start, _end)``."""
        self._target: bytearray | None = None
        """Where a large read in progress is received, until it is full."""
        self._large = False
        """A large read is in progress (its target may be full and handed back already)."""
        self._filled = 0
        self._wanted = 0
        """Bytes the waiting reader needs (in the read-ahead buffer, or in ``_target``)."""
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._lost: BaseException | None = None
        self._closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._paused = False
        self._writable = asyncio.Event()
        self._writable.set()

    # --- the transport's side ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's do not derive from asyncio's classes.
        self.transport = cast(asyncio.Transport, transport)
        self._on_connect(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            return memoryview(self._target)[self._filled :]
        if self._end == len(self._ahead):
            # Move the unread bytes to the front; the space after them is what reads fill.
            unread = self._end - self._start
            self._ahead[:unread] = self._ahead[self._start : self._end]
            self._start, self._end = 0, unread
        return memoryview(self._ahead)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled == len(self._target):
                # What arrives before the reader runs goes to the read-ahead buffer: an event
                # loop may ask for the next buffer at once (uvloop does), and an empty one is
                # a fatal error of the transport.
                self._target = None
                self._wake()
            return
        self._end += nbytes
        if self._end - self._start >= self._wanted:
            self._wake()
        if self._end == len(self._ahead) and self._start == 0:
            self._pause()  # full, and no read wants more of it now

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc or ConnectionResetError("connection lost")
        self._eof = True
        self._wake()
        self._writable.set()  # a writer waiting for room gets the error instead
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # --- the reader's side -------------------------------------------------------------------

    async def read_exactly(self, size: int) -> bytes | bytearray:
        """The next ``size`` bytes.

        Raises:
            asyncio.IncompleteReadError: the client closed first (``partial`` has what came).
        """
        unread = self._end - self._start
        if size >= DIRECT_BYTES:
            # Take what the read-ahead buffer holds, then receive the rest in place.
            target = bytearray(size)
            taken = min(unread, size)
            target[:taken] = self._ahead[self._start : self._start + taken]
            self._start += taken
            if taken < size:
                self._target, self._filled, self._large = target, taken, True
                try:
                    await self._wait(size)
                finally:
                    filled, self._target, self._large = self._filled, None, False
                if filled < size:
                    raise asyncio.IncompleteReadError(bytes(target[:filled]), size)
            self._reset_if_empty()
            return target
        if unread < size:
            if size > len(self._ahead) - self._start:
                self._compact()
            await self._wait(size)
            unread = self._end - self._start
            if unread < size:
                partial = bytes(self._ahead[self._start : self._end])
                self._start = self._end
                raise asyncio.IncompleteReadError(partial, size)
        data = bytes(self._ahead[self._start : self._start + size])
        self._start += size
        self._reset_if_empty()
        return data

    def buffered_bytes(self) -> int:
        """Bytes received and not read yet, outside a large read in progress."""
        return self._end - self._start

    async def _wait(self, size: int) -> None:
        """Until ``size`` bytes are in (as counted by :meth:`buffer_updated`) or the stream
        ends."""
        while not self._have(size):
            if self._eof:
                return  # ended or lost: the caller sees a short read either way
            self._wanted = size
            self._waiter = asyncio.get_running_loop().create_future()
            self._resume()
            try:
                await self._waiter
            finally:
                self._waiter = None
                self._wanted = 0

    def _have(self, size: int) -> bool:
        if self._large:
            return self._filled >= size
        return self._end - self._start >= size

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _compact(self) -> None:
        unread = self._end - self._start
        self._ahead[:unread] = self._ahead[self._start : self._end]
        self._start, self._end = 0, unread

    def _reset_if_empty(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
            self._resume()  # room again

    def _pause(self) -> None:
        if not self._paused and self.transport is not None and not self._eof:
            self._paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self._paused and self.transport is not None and not self._eof:
            self._paused = False
            self.transport.resume_reading()

    # --- the writer's side -------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            # asyncio's transports drop such writes, uvloop's raise RuntimeError: one error.
            raise ConnectionResetError("connection closed")
        self.transport.write(data)

    async def write_all(self, parts: Iterable[bytes | bytearray | memoryview]) -> None:
        """Write ``parts`` in order, :data:`WRITE_SLICE_BYTES` at a time, each slice once the
        transport takes writes (:meth:`drain`): the socket takes most of a slice at once,
        where the transport would copy whatever it did not take of a whole part."""
        for part in parts:
            view = memoryview(part).cast("B")
            for start in range(0, len(view), WRITE_SLICE_BYTES):
                await self.drain()
                self.write(view[start : start + WRITE_SLICE_BYTES])

    async def drain(self) -> None:
        """Until the transport takes writes again (once past its high-water mark, its buffer
        must come down to the low-water mark)."""
        await self._writable.wait()
        if self._lost is not None:
            raise ConnectionResetError("connection lost")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None and not self._closed.done():
            self.transport.abort()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)

    def get_extra_info(self, name: str) -> Any:
        return None if self.transport is None else self.transport.get_extra_info(name)
