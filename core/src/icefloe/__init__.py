"""Icefloe: a Kafka-compatible streaming engine that lands topics in lakehouse tables."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from icefloe.kio_without_hypothesis import import_kio_without_hypothesis

# Before any of Icefloe's modules import kio, in every process that imports Icefloe: the
# `icefloe` command, and the brokers and the compactor that `icefloe serve` spawns.
import_kio_without_hypothesis()

try:
    __version__ = version("icefloe")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0+unknown"
