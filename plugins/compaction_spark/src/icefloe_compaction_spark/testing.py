"""Options that start Spark quickly and quietly, for test suites (this one's and yours)."""

from __future__ import annotations

from typing import Any, Final

QUICK_LOCAL_OPTIONS: Final[dict[str, Any]] = {
    "master": "local[2]",
    "app_name": "icefloe-compaction-test",
    "log_level": "WARN",
    "conf": {
        "spark.ui.enabled": "false",
        "spark.driver.memory": "512m",
        # Loopback only: no host-name lookup, nothing listening on outside interfaces.
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        # A short-lived JVM starts faster with the client compiler and the serial collector.
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        "spark.default.parallelism": "2",
    },
}
"""``[compaction.spark]`` options for tests: two local threads, no UI, a small driver."""
