"""Port keys as etcd keys: the namespace prefix, and range ends in etcd's byte order.

etcd orders keys by their bytes, which is the port's order for UTF-8 keys: a port key is stored
as ``<namespace>/<key>`` encoded as UTF-8, unchanged otherwise.
"""

from __future__ import annotations

from typing import Final

ALL: Final = b"\x00"
"""As a range end: no upper bound (etcd's convention)."""


def prefix_end(prefix: bytes) -> bytes:
    """The least key greater than every key starting with ``prefix`` (``ALL`` if none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return ALL
    return stripped[:-1] + bytes([stripped[-1] + 1])


class KeySpace:
    """A store's namespace in etcd."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}/".encode() if namespace else b""
        self.start = self.prefix or ALL
        self.end = prefix_end(self.prefix)

    def stored(self, key: str) -> bytes:
        return self.prefix + key.encode()

    def key_of(self, stored: bytes) -> str:
        return stored[len(self.prefix) :].decode()
