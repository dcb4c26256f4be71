"""CRC-32C (Kafka's record batch checksum, and the WAL format's) that keeps the GIL for short
inputs.

The library lets the GIL go for any input of 32 KiB or more. A 64 KiB batch takes a few
microseconds to check; letting the GIL go for that long hands it to whichever other thread
is waiting for it (the metadata store's, the WAL's, a decoding pool's), and the caller,
mostly the event loop, then waits for that thread to give it back. Only inputs long enough
to be worth another thread's turn let it go.
"""

from __future__ import annotations

from crc32c import crc32c as _crc32c

RELEASE_THE_GIL_FROM = 1 << 20
"""Bytes from which a checksum lets the GIL go (about 60 microseconds of work)."""

_KEEP, _RELEASE = 0, 1  # the library's gil_release_mode values


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """The CRC-32C of ``data`` (bytes, or a view of bytes), continuing from ``value``."""
    mode = _KEEP if len(data) < RELEASE_THE_GIL_FROM else _RELEASE
    return int(_crc32c(data, value, mode))
