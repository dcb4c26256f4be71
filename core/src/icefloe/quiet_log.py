"""Log lines that could repeat without end, kept few.

A consumer retries a failed fetch every few hundred milliseconds; a scanner may send a bad
frame per millisecond. Each distinct message is logged once, then again only after
``every_s`` seconds, with how many times it was held back meanwhile. And a clean-up that
deletes thousands of objects says so in one line (:func:`summary`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

MAX_MESSAGES = 1024
"""Distinct messages remembered; the oldest is forgotten first (memory stays bounded)."""


def summary(keys: list[str], noun: str, shown: int = 3) -> str:
    """``keys`` counted in one line, the first few named: ``2 orphaned files (a, b)``."""
    named = ", ".join(keys[:shown]) + (", …" if len(keys) > shown else "")
    return f"{len(keys)} {noun}{'' if len(keys) == 1 else 's'} ({named})"


class QuietLog:
    def __init__(self, logger: logging.Logger, every_s: float) -> None:
        self._logger = logger
        self._every_s = every_s
        self._seen: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def warning(self, message: str) -> None:
        self._log(logging.WARNING, message)

    def error(self, message: str) -> None:
        self._log(logging.ERROR, message)

    def info(self, message: str) -> None:
        self._log(logging.INFO, message)

    def _log(self, level: int, message: str) -> None:
        now = time.monotonic()
        last, held_back = self._seen.get(message, (float("-inf"), 0))
        if now - last < self._every_s:
            self._seen[message] = (last, held_back + 1)
            return
        self._seen[message] = (now, 0)
        self._seen.move_to_end(message)
        while len(self._seen) > MAX_MESSAGES:
            self._seen.popitem(last=False)
        suffix = f" (and {held_back} more times since)" if held_back else ""
        self._logger.log(level, "%s%s", message, suffix)
