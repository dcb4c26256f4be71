"""Keep what lives as long as the process out of the garbage collector's full passes.

A full pass walks every object the collector tracks and holds the event loop meanwhile. Most of
them in a broker are modules, classes and protocol schemas that never die, and many arrive
after start: a request type's schemas on its first request, a table format's library on the
first compaction. ``gc.freeze()`` moves what is tracked now to a generation no pass walks; a
broker freezes once started and then, whenever imports have come and stopped for a period,
again. Each freeze follows a full collection, so no garbage is frozen with the live objects.
What is alive at a freeze and later dies in a reference cycle (a request in flight then) is
never reclaimed; imports are finite, so the freezes, and what they can strand, are few.
"""

from __future__ import annotations

import asyncio
import gc
import sys
from typing import Final

SETTLE_S: Final = 2.0
"""Imports stopped this long count as settled."""


def freeze_long_lived() -> None:
    """Collect, then move every object tracked now out of reach of later passes."""
    gc.collect()
    gc.freeze()


async def freeze_new_imports(settle_s: float = SETTLE_S) -> None:
    """Until cancelled: once modules have been imported and imports have settled, freeze."""
    frozen_with = seen = len(sys.modules)
    while True:
        await asyncio.sleep(settle_s)
        modules = len(sys.modules)
        if modules == seen and modules != frozen_with:
            freeze_long_lived()
            frozen_with = modules
        seen = modules
