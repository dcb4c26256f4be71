"""The Prometheus metrics every broker process exports (``icefloe_*``), in one place.

Counters and histograms are process-wide, like the process itself: a broker updates them where
the work happens. Values that are cheaper to read than to track (object-store request counts,
memory in use, cache sizes) are read when scraped, from *sources* a broker registers with
:func:`add_source` and removes when it stops.

This module sits at the bottom of the layers, so any layer may count what it does; it imports
nothing of Icefloe's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Final

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

# A `_created` series per counter doubles what a scrape carries and no dashboard here uses it.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LATENCY_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_SIZE_BUCKETS: Final = tuple(float(1 << n) for n in range(10, 28, 2))  # 1 KiB … 128 MiB

# --- Kafka requests and clients ---------------------------------------------------------------

REQUEST_SECONDS: Final = Histogram(
    "icefloe_kafka_request_seconds",
    "Kafka requests handled, by API and version, and how long each took to answer",
    ["api", "version"],
    buckets=_LATENCY_BUCKETS,
)
REQUEST_ERRORS: Final = Counter(
    "icefloe_kafka_request_errors",
    "Error codes answered to Kafka requests (one per topic, partition or group that failed)",
    ["api", "code"],
)
BYTES_IN: Final = Counter(
    "icefloe_kafka_bytes_in", "Record batch bytes accepted from producers", ["topic"]
)
BYTES_OUT: Final = Counter(
    "icefloe_kafka_bytes_out", "Record batch bytes sent to consumers", ["topic"]
)
CROSS_ZONE_BYTES: Final = Counter(
    "icefloe_cross_zone_bytes",
    "Bytes exchanged with clients whose zone (client.id zone_id=) differs from the broker's",
    ["direction"],
)
AUTHENTICATIONS: Final = Counter(
    "icefloe_authentications", "SASL logins, by mechanism and result", ["mechanism", "result"]
)
QUOTA_THROTTLE_SECONDS: Final = Counter(
    "icefloe_quota_throttle_seconds",
    "Time clients over a quota were throttled (their connection muted), by the quota that "
    "decided it: produce, fetch, request or controller_mutation",
    ["quota"],
)
QUOTA_THROTTLED_RESPONSES: Final = Counter(
    "icefloe_quota_throttled_responses",
    "Responses that carried a throttle time, by the quota that decided it",
    ["quota"],
)
for _quota in ("produce", "fetch", "request"):  # exported at 0 before any throttling
    QUOTA_THROTTLE_SECONDS.labels(_quota)
    QUOTA_THROTTLED_RESPONSES.labels(_quota)
CONNECTIONS: Final = Gauge("icefloe_connections", "Kafka client connections open now")
CONNECTIONS_ACCEPTED: Final = Counter(
    "icefloe_connections_accepted", "Kafka client connections accepted"
)

# --- storage ------------------------------------------------------------------------------------

WAL_FLUSH_SECONDS: Final = Histogram(
    "icefloe_wal_flush_seconds",
    "WAL flushes: from sealing an object to its index entries being committed",
    buckets=_LATENCY_BUCKETS,
)
WAL_FLUSH_BYTES: Final = Histogram(
    "icefloe_wal_flush_bytes", "Size of each WAL object written", buckets=_SIZE_BUCKETS
)
WAL_FLUSH_FAILURES: Final = Counter(
    "icefloe_wal_flush_failures", "WAL flushes that failed (their produces were answered errors)"
)
WAL_RECORDS: Final = Counter("icefloe_wal_records", "Records written to the WAL")
INDEX_CACHE: Final = Counter(
    "icefloe_index_cache_lookups",
    "Offset-index lookups, by whether the broker's cache answered them",
    ["result"],
)
METADATA_SECONDS: Final = Histogram(
    "icefloe_metadata_op_seconds",
    "Metadata-store operations, by operation, and how long each took",
    ["op"],
    buckets=_LATENCY_BUCKETS,
)
METADATA_FAILURES: Final = Counter(
    "icefloe_metadata_op_failures", "Metadata-store operations that raised", ["op"]
)

# --- compaction and tables ----------------------------------------------------------------------

COMPACTION: Final = CollectorRegistry(auto_describe=True)
"""What compaction counts. It may run in a process of its own beside the broker's
(:mod:`icefloe.broker.compactor_process`), which then reports these for the broker to export:
they are exported as a source (below), so that the broker's values and its compactor's add up
into one family each."""

TABLE_COMMIT_SECONDS: Final = Histogram(
    "icefloe_table_commit_seconds",
    "Commits of compacted files to a lakehouse table, by format",
    ["format"],
    buckets=_LATENCY_BUCKETS,
    registry=COMPACTION,
)
TABLE_COMMIT_FAILURES: Final = Counter(
    "icefloe_table_commit_failures",
    "Table commits that failed (retried later)",
    ["format"],
    registry=COMPACTION,
)
COMPACTED_BYTES: Final = Counter(
    "icefloe_compacted_wal_bytes",
    "WAL bytes compacted into Parquet",
    ["topic"],
    registry=COMPACTION,
)
COMPACTED_PARQUET_BYTES: Final = Counter(
    "icefloe_compacted_parquet_bytes",
    "Parquet bytes written by compaction",
    ["topic"],
    registry=COMPACTION,
)
DEAD_LETTERS: Final = Counter(
    "icefloe_dead_letters",
    "Records of a schema-backed topic compaction could not decode into typed columns (kept "
    "raw, with the reason in <side>_error)",
    ["topic"],
    registry=COMPACTION,
)
COMPACTOR_OPEN: Final = Gauge(
    "icefloe_compactor_open",
    "1 once this broker's compactor has opened its compaction engine and table formats (it "
    "then competes for the compaction lease); 0 before, while a backend cannot be opened, while "
    "its process restarts, and with compaction off",
    registry=COMPACTION,
)
COMPACTOR_RESTARTS: Final = Counter(
    "icefloe_compactor_restarts",
    "Times this broker started its compactor's process again after it died",
    registry=COMPACTION,
)
COMPACTION_BACKLOG_BYTES: Final = Gauge(
    "icefloe_compaction_backlog_bytes",
    "WAL bytes waiting for compaction, per topic (set by the compaction leader)",
    ["topic"],
    registry=COMPACTION,
)
COMPACTION_BACKLOG_RECORDS: Final = Gauge(
    "icefloe_compaction_backlog_records",
    "Records waiting for compaction, per topic (set by the compaction leader)",
    ["topic"],
    registry=COMPACTION,
)
COMPACTION_BACKLOG_AGE: Final = Gauge(
    "icefloe_compaction_backlog_age_seconds",
    "Age of the oldest WAL entry waiting for compaction, per topic",
    ["topic"],
    registry=COMPACTION,
)
COMPACTION_RUN_FAILURES: Final = Counter(
    "icefloe_compaction_run_failures",
    "Tries of a compaction run that failed, per topic of the run (each is tried again)",
    ["topic"],
    registry=COMPACTION,
)
COMPACTION_RUNS_SET_ASIDE: Final = Gauge(
    "icefloe_compaction_runs_set_aside",
    "Compaction runs set aside after failing repeatedly, per topic: their streams wait for "
    "the retry (`icefloe tables` says why; `icefloe tables retry` retries now)",
    ["topic"],
    registry=COMPACTION,
)
COMPACTION_YIELDING: Final = Gauge(
    "icefloe_compaction_yielding",
    "1 while compaction waits because other processes keep the host's CPU busy ([compactor] "
    "yield_above_cpu); 0 otherwise",
    registry=COMPACTION,
)

# --- the process --------------------------------------------------------------------------------

EVENT_LOOP_LAG: Final = Histogram(
    "icefloe_event_loop_lag_seconds",
    "How late the broker's event loop woke a ticker: time every client waited meanwhile",
    buckets=_LATENCY_BUCKETS,
)


@contextmanager
def timed(histogram: Histogram, failures: Counter | None = None) -> Iterator[None]:
    """Observe the block's duration; count it in ``failures`` too if it raises."""
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        if failures is not None:
            failures.inc()
        raise
    finally:
        histogram.observe(time.perf_counter() - start)


# --- values read when scraped -------------------------------------------------------------------

Source = Callable[[], Iterable[Metric]]
"""Returns metric families with their current values."""


class _Sources(Collector):
    def __init__(self) -> None:
        self._sources: dict[int, Source] = {}
        self._lock = threading.Lock()
        self._next = 0

    def add(self, source: Source) -> Callable[[], None]:
        with self._lock:
            self._next += 1
            key = self._next
            self._sources[key] = source
        return lambda: self._remove(key)

    def _remove(self, key: int) -> None:
        with self._lock:
            self._sources.pop(key, None)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            sources = list(self._sources.values())
        # Brokers in one process (tests, embedded use) each add the same families: export each
        # once, summing what they report for the same labels (the process's total).
        merged: dict[str, Metric] = {}
        for source in sources:
            for family in source():
                into = merged.setdefault(family.name, family)
                if into is not family:
                    into.samples.extend(family.samples)
        for family in merged.values():
            family.samples = _summed(family.samples)
            yield family


def _summed(samples: list[Sample]) -> list[Sample]:
    totals: dict[tuple[str, tuple[tuple[str, str], ...]], Sample] = {}
    for sample in samples:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        seen = totals.get(key)
        totals[key] = sample if seen is None else seen._replace(value=seen.value + sample.value)
    return list(totals.values())


_SOURCES: Final = _Sources()
REGISTRY.register(_SOURCES)
_SOURCES.add(COMPACTION.collect)


def add_source(source: Source) -> Callable[[], None]:
    """Have ``source`` answer each scrape; returns the function that removes it."""
    return _SOURCES.add(source)


def counter(name: str, documentation: str, labels: list[str]) -> CounterMetricFamily:
    """An empty counter family for a source (``name`` without ``_total``)."""
    return CounterMetricFamily(name, documentation, labels=labels)


def gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    """An empty gauge family for a source."""
    return GaugeMetricFamily(name, documentation, labels=labels)


def object_store_families(stats: Mapping[str, Mapping[str, Mapping[str, int]]]) -> list[Metric]:
    """The object-store request and byte counters of ``stats``: snapshots of request counters
    (``{"requests": {"PUT": n, …}, "bytes": {…}}``) by who sent the requests (``broker``,
    ``compaction``)."""
    requests = counter(
        "icefloe_object_store_requests",
        "Requests sent to the object store, by the broker or by its compaction",
        ["kind", "by"],
    )
    moved = counter(
        "icefloe_object_store_bytes",
        "Payload bytes moved to (PUT) and from (GET) the object store",
        ["kind", "by"],
    )
    for by, counted in stats.items():
        for kind, count in counted["requests"].items():
            requests.add_metric([kind, by], count)
        for kind, count in counted["bytes"].items():
            moved.add_metric([kind, by], count)
    return [requests, moved]
