"""Building blocks that adapters share, beside the ports at the bottom of core's layers.

They import nothing from Icefloe but :mod:`icefloe.errors` and :mod:`icefloe.ports`, so a
plugin, which depends on ``icefloe`` and its SDK only, may use them as well as core's own
embedded adapters:

- :class:`~icefloe.adapters.blocking.BlockingSdk`: a synchronous SDK's calls on a bounded
  thread pool, refused after close, with its exceptions translated.
- :class:`~icefloe.adapters.write_id.WriteIds`: create-if-absent writes that tell their own
  earlier, answered-too-late attempt from another writer's object.
- :class:`~icefloe.adapters.watch_queue.WatchQueue`: a watch's bounded queue of events that
  overflows into a single ``RESET``.
"""

from __future__ import annotations

from icefloe.adapters.blocking import BlockingSdk
from icefloe.adapters.watch_queue import WatchQueue
from icefloe.adapters.write_id import Refusal, WriteIds, new_write_id

__all__ = ["BlockingSdk", "Refusal", "WatchQueue", "WriteIds", "new_write_id"]
