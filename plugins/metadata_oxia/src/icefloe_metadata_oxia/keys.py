"""How port keys become Oxia keys: byte order preserved, one partition key per parent path.

Oxia sorts keys *hierarchically*: by the number of ``/`` first, then segment by segment. The
port wants plain UTF-8 byte order (``a/b/c`` before ``a/c``, ``a-b`` before ``a/b``). Both orders
agree on keys that contain no ``/``, so stored keys contain none: ``/`` and the escape character
``.`` are replaced by two-character escapes that sort exactly where the originals did::

    "."  ->  ".."        "/"  ->  ".~"        (every other character is kept)

Every character below ``.`` stays below both escapes and every character above ``/`` stays above
them, and ``..`` < ``.~`` as ``.`` < ``/``; the code is prefix-free, so comparing encoded keys
compares the originals. Sequence suffixes (``-%020d``), which the server appends to an encoded
prefix, need no escaping. Oxia's own internal keys (``__oxia/…``) contain ``/``: they sort after
every encoded key and never decode, so they never show up in a scan.

Partitioning: every operation on a key routes with the partition key ``<namespace>/<parent>``
(parent: everything up to the key's last ``/``), so a sequence and all its entries live on one
shard, as the server's sequence assignment requires. Ordered reads without a key (scan, floor,
ceiling) ask every shard and merge.
"""

from __future__ import annotations

from typing import Final

_ESCAPE: Final = "."
_ENCODE: Final = str.maketrans({".": "..", "/": ".~"})
_DECODE: Final = {".": ".", "~": "/"}


def encode(key: str) -> str:
    """The Oxia key of a logical key (already namespaced)."""
    return key.translate(_ENCODE)


def decode(stored: str) -> str | None:
    """The logical key of an Oxia key, or ``None`` if the key was not written by this codec."""
    if "/" in stored:
        return None
    if _ESCAPE not in stored:
        return stored
    out: list[str] = []
    chars = iter(stored)
    for char in chars:
        if char != _ESCAPE:
            out.append(char)
            continue
        original = _DECODE.get(next(chars, ""))
        if original is None:
            return None
        out.append(original)
    return "".join(out)


class KeySpace:
    """A store's namespace in Oxia: maps port keys to stored keys and partition keys."""

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}/" if namespace else ""

    def stored(self, key: str) -> str:
        """The Oxia key of the port key ``key``."""
        return encode(self.prefix + key)

    def partition(self, key: str) -> str:
        """The partition key of ``key``: its namespaced parent path."""
        parent, _, _ = key.rpartition("/")
        return self.prefix + parent

    def bound(self, key: str) -> str:
        """The Oxia key of a range bound (which may be outside any real key)."""
        return encode(self.prefix + key)

    def start(self) -> str:
        """The least Oxia key of this namespace."""
        return encode(self.prefix)

    def key_of(self, stored: str) -> str | None:
        """The port key of an Oxia key, or ``None`` if it belongs to another namespace."""
        logical = decode(stored)
        if logical is None or not logical.startswith(self.prefix) or logical == self.prefix:
            return None
        return logical[len(self.prefix) :]
