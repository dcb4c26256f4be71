"""The event loop a broker process runs on.

Every client of a broker process is served by one event loop, so what the loop itself costs
per socket read, write and wake-up is paid on every request. uvloop (libuv) costs less of it
than the standard library's selector loop: measured in turn, the same broker took about a
quarter more from Kafka's Java producer on it and a tenth more on catch-up reads from Parquet
(docs/performance.md). Both loops are supported, and the broker's code keeps to what both
provide.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from icefloe.config.broker import EventLoopChoice
from icefloe.errors import ConfigError

LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def event_loop_factory(choice: EventLoopChoice) -> LoopFactory:
    """What makes the loop ``choice`` names: ``auto`` is uvloop where it is installed.

    Raises:
        ConfigError: ``uvloop`` was chosen and is not installed.
    """
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigError(
                "[broker] event_loop = 'uvloop' needs uvloop, which is not installed: "
                "pip install uvloop (it does not run on Windows), or set event_loop = 'asyncio'"
            ) from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: which loop runs the caller."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"
