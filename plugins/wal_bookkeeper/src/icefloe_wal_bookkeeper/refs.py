"""WAL references of the BookKeeper WAL: ``bk1:<ledger id>:<size>:<entry size>``.

A WAL object is one ledger; its bytes are the ledger's entries in order, each ``entry size``
bytes but the last. The reference says all a reader needs to find any byte range without
asking anyone: entry ``i`` holds bytes ``[i * entry size, min((i + 1) * entry size, size))``.
``bk1`` names the layout (version 1). Everything is checked when a reference is parsed, and the
same facts are checked again against the ledger's own metadata before anything is read, so a
malformed, foreign or hostile reference is a :class:`~icefloe.errors.NotFoundError`, never a
huge read or a crash.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from icefloe.errors import NotFoundError

PREFIX: Final = "bk1"
MAX_LEDGER_ID: Final = (1 << 63) - 1
MIN_ENTRY_SIZE: Final = 4 << 10
MAX_ENTRY_SIZE: Final = 4 << 20
"""Below BookKeeper's default frame limit (5 MiB, ``nettyMaxFrameSizeBytes``) with headroom."""
MAX_OBJECT_SIZE: Final = 1 << 34
"""16 GiB: far more than any WAL object, small enough to bound every computation."""

_REF: Final = re.compile(r"bk1:(0|[1-9][0-9]{0,18}):([1-9][0-9]{0,11}):([1-9][0-9]{0,7})")


@dataclass(frozen=True, slots=True)
class LedgerRef:
    """Where a WAL object is: its ledger, its size and how it is cut into entries."""

    ledger_id: int
    size: int
    entry_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.ledger_id <= MAX_LEDGER_ID:
            raise ValueError(f"ledger id {self.ledger_id} out of range")
        if not 1 <= self.size <= MAX_OBJECT_SIZE:
            raise ValueError(f"size {self.size} out of range [1, {MAX_OBJECT_SIZE}]")
        if not MIN_ENTRY_SIZE <= self.entry_size <= MAX_ENTRY_SIZE:
            raise ValueError(
                f"entry size {self.entry_size} out of range [{MIN_ENTRY_SIZE}, {MAX_ENTRY_SIZE}]"
            )

    @property
    def entries(self) -> int:
        return -(-self.size // self.entry_size)

    def entry_length(self, entry_id: int) -> int:
        """How many bytes entry ``entry_id`` holds."""
        return min(self.entry_size, self.size - entry_id * self.entry_size)

    def entry_range(self, start: int, end: int) -> tuple[int, int]:
        """First and last entry holding bytes ``[start, end)``, ``0 <= start < end <= size``."""
        return start // self.entry_size, (end - 1) // self.entry_size

    def __str__(self) -> str:
        return f"{PREFIX}:{self.ledger_id}:{self.size}:{self.entry_size}"


def parse(ref: str) -> LedgerRef:
    """The ledger reference ``ref``.

    Raises:
        NotFoundError: ``ref`` is not a reference this WAL could have returned.
    """
    match = _REF.fullmatch(ref)
    if match is None:
        raise NotFoundError(
            f"{ref[:80]!r} is not a BookKeeper WAL reference "
            "(expected bk1:<ledger id>:<size>:<entry size>)"
        )
    try:
        return LedgerRef(int(match[1]), int(match[2]), int(match[3]))
    except ValueError as exc:
        raise NotFoundError(f"{ref!r} is not a BookKeeper WAL reference: {exc}") from exc
