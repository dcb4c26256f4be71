"""What entitles the compaction leader to act: its lease, and the term it was elected in.

The leader holds ``compaction/leader`` through a metadata-store session. It acts only while it
can prove the session holds: until :data:`LEAD_FRACTION` of the ttl has passed since the last
keep-alive the store answered was sent (:meth:`Session.holds_until`), well before the store may
expire the session and let another broker take the key. The leader checks that before every
step of the saga and a watchdog cancels its round the moment it passes, whether or not the
adapter has noticed yet that the session is lost. If a keep-alive is answered after all before
the session is lost, the session held throughout (nobody else can have taken the key), and the
leader goes on in the same term.

The *term* is the version the leader key got when this leader wrote it: it grows with every
election. Each saga record carries the term of the leader that last wrote it, and a new leader
first claims each unfinished record by compare-and-set (:meth:`Committer.claim`), so a step an
older leader still had under way fails instead of overwriting it, and the older leader does
not write the record again to count the failure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from icefloe.errors import IcefloeError
from icefloe.ports.metadata import Session

LEAD_FRACTION: Final = 2 / 3
"""The share of the lease's ttl after its last renewal during which the leader acts. Keep-alives
go every sixth of the ttl (:data:`~icefloe.ports.metadata.KEEP_ALIVES_PER_TTL`), so a leader
whose store answers each within half the ttl never reaches it; the last third is the margin
for a step under way and for clocks that run at different rates."""


class LeadershipLostError(IcefloeError):
    """The compaction leader can no longer prove its lease: it must stop acting."""


@dataclass(frozen=True, slots=True)
class Lease:
    """The compaction leadership this process holds (``session`` ``None``: none to prove, as
    for a compactor driven directly, without the leader key)."""

    session: Session | None
    term: int

    def deadline(self) -> float:
        """The ``time.monotonic()`` after which this leader must not act."""
        if self.session is None:
            return float("inf")
        return self.session.holds_until(LEAD_FRACTION)

    def check(self) -> None:
        """Raise :class:`LeadershipLostError` unless the lease still provably holds."""
        if self.session is None:
            return
        if not self.session.alive or time.monotonic() >= self.deadline():
            raise LeadershipLostError(
                f"the compaction lease of term {self.term} is lost or not renewed in time"
            )


UNLEADED: Final = Lease(None, 0)
"""No lease to prove: a compactor driven directly (tests, tools), not through the leader
key."""
