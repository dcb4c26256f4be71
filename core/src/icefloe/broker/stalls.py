"""Notice when something blocks the event loop.

Every client of a broker process is served by one event loop; a handler that computes for
half a second without awaiting freezes all of them, and the process looks alive all the
while. A ticker that asks to wake every ``period_s`` measures how late each wake-up comes:
lateness over ``threshold_s`` is a stall, counted and logged (once per ``report_every_s`` at
most, with the count and the worst stall since the last report). Every lateness goes to the
event-loop lag histogram of the metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time

from icefloe import metrics

log = logging.getLogger(__name__)


class StallDetector:
    def __init__(
        self, threshold_s: float = 0.1, period_s: float = 0.05, report_every_s: float = 10.0
    ) -> None:
        self.threshold_s = threshold_s
        self.period_s = period_s
        self.report_every_s = report_every_s
        self.stalls = 0
        """Stalls seen since the detector started."""
        self.worst_s = 0.0
        """The longest stall seen since the detector started."""
        self._unreported = 0
        self._unreported_worst = 0.0
        self._reported_at = float("-inf")

    async def run(self) -> None:
        """Tick until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period_s
            await asyncio.sleep(self.period_s)
            late = loop.time() - due
            metrics.EVENT_LOOP_LAG.observe(max(late, 0.0))
            if late > self.threshold_s:
                self._stalled(late)

    def _stalled(self, seconds: float) -> None:
        self.stalls += 1
        self.worst_s = max(self.worst_s, seconds)
        self._unreported += 1
        self._unreported_worst = max(self._unreported_worst, seconds)
        now = time.monotonic()
        if now - self._reported_at >= self.report_every_s:
            log.warning(
                "event loop stalled %d time(s) for up to %.0f ms: every client of this broker "
                "waited meanwhile",
                self._unreported,
                self._unreported_worst * 1000,
            )
            self._reported_at = now
            self._unreported = 0
            self._unreported_worst = 0.0
