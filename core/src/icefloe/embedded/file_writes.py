"""Hear from the kernel that a file was written, instead of asking every few milliseconds.

The embedded metadata store must notice commits made by other processes (another broker on
the machine, an ``icefloe`` command). Asking SQLite whether anything changed costs a thread
hop and a wakeup; done every 10 ms, that alone kept an idle broker at several percent of a
core.
On Linux, inotify tells when a file in the database's folder is written, so the store need
ask often only while someone writes, and at rest hardly at all.

The reader is registered on the event loop for as long as the watch lives: an event costs a
callback on a loop that is awake anyway under load, and nothing at rest. Writes made by this
process are heard too; telling them apart would take more than the questions they cause.

Where inotify is missing (not Linux, or the per-user limit on inotify instances reached),
:meth:`FileWrites.watch` returns ``None`` and the caller keeps asking at its usual pace.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

log = logging.getLogger(__name__)

try:
    import inotify_simple
except ImportError:  # not Linux: the dependency is only installed there
    inotify_simple = None


class FileWrites:
    """Notes when any of some files in one folder is written, created or moved into place."""

    def __init__(
        self,
        notify: Any,
        folder: Path,
        names: frozenset[str],
        on_write: Callable[[], None] | None,
    ) -> None:
        """Use :meth:`watch`."""
        self._notify = notify
        self._folder = folder
        self._names = names
        self._on_write = on_write
        self._loop = asyncio.get_running_loop()
        self.last_write = time.monotonic()
        """When a write was last heard of (``time.monotonic()``); a fresh watch counts as
        one, since writes just before it began were not heard, and a broken one as a write
        for ever after."""
        self._loop.add_reader(notify.fileno(), self._on_readable)

    @classmethod
    def watch(
        cls, folder: Path, names: Iterable[str], on_write: Callable[[], None] | None = None
    ) -> Self | None:
        """Watch the files ``names`` in ``folder`` (they need not exist yet); ``None`` where
        inotify is not available. ``on_write`` is called on the event loop after each batch
        of writes heard."""
        if inotify_simple is None:
            return None
        flags = inotify_simple.flags
        try:
            notify = inotify_simple.INotify(nonblocking=True)
        except OSError as exc:  # EMFILE: fs.inotify.max_user_instances reached
            log.info("cannot watch %s for writes (%s); polling instead", folder, exc)
            return None
        try:
            notify.add_watch(folder, flags.MODIFY | flags.CREATE | flags.MOVED_TO)
        except OSError as exc:  # ENOSPC: fs.inotify.max_user_watches reached
            notify.close()
            log.info("cannot watch %s for writes (%s); polling instead", folder, exc)
            return None
        return cls(notify, folder, frozenset(names), on_write)

    def quiet_for(self, seconds: float) -> bool:
        """Whether no write was heard in the last ``seconds``."""
        return time.monotonic() - self.last_write > seconds

    def close(self) -> None:
        """Stop watching (idempotent)."""
        if not self._notify.closed:
            self._loop.remove_reader(self._notify.fileno())
            self._notify.close()

    def _on_readable(self) -> None:
        try:
            events = self._notify.read(timeout=0)
        except OSError as exc:
            # A descriptor that cannot be read would stay readable and spin the loop: stop
            # listening, and count as written from now on, so the caller asks at its own pace.
            log.warning("cannot read write events in %s (%s); polling instead", self._folder, exc)
            self.close()
            self.last_write = math.inf
        else:
            overflow = inotify_simple.flags.Q_OVERFLOW
            if not any(e.name in self._names or e.mask & overflow for e in events):
                return
            self.last_write = time.monotonic()
        if self._on_write is not None:
            self._on_write()
