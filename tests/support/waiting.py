"""Waiting in a test for state that another task or process brings about."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def eventually(check: Callable[[], bool], seconds: float = 5.0) -> None:
    """Return once ``check()`` holds, looking every 20 ms.

    Raises:
        AssertionError: it did not hold within ``seconds``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"not within {seconds:g} s")
        await asyncio.sleep(0.02)
