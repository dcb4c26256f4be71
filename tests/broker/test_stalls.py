"""The event-loop stall detector counts and reports a loop that something blocked."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from icefloe.broker.stalls import StallDetector


def block_the_loop(seconds: float) -> None:
    """What a handler that computes without awaiting does to every other task."""
    time.sleep(seconds)


async def test_a_blocked_loop_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    detector = StallDetector(threshold_s=0.1, period_s=0.01)
    watching = asyncio.create_task(detector.run())
    await asyncio.sleep(0.05)
    with caplog.at_level(logging.WARNING, logger="icefloe.broker.stalls"):
        block_the_loop(0.4)
        await asyncio.sleep(0.05)
    watching.cancel()

    assert detector.stalls == 1
    assert detector.worst_s >= 0.3
    assert "event loop stalled 1 time(s)" in caplog.text


async def test_a_loop_that_keeps_turning_has_no_stalls() -> None:
    detector = StallDetector(threshold_s=0.1, period_s=0.01)
    watching = asyncio.create_task(detector.run())
    for _ in range(20):
        await asyncio.sleep(0.01)
    watching.cancel()

    assert detector.stalls == 0


async def test_reports_are_rate_limited_but_every_stall_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    detector = StallDetector(threshold_s=0.05, period_s=0.01, report_every_s=60)
    watching = asyncio.create_task(detector.run())
    with caplog.at_level(logging.WARNING, logger="icefloe.broker.stalls"):
        for _ in range(3):
            await asyncio.sleep(0.03)
            block_the_loop(0.15)
        await asyncio.sleep(0.03)
    watching.cancel()

    assert detector.stalls == 3
    assert caplog.text.count("event loop stalled") == 1
