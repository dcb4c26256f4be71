"""Icefloe: a Kafka-compatible streaming engine that lands topics in lakehouse tables."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("icefloe")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0+unknown"
