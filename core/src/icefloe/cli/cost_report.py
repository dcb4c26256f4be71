"""What a cluster costs, from the brokers' counters: the arithmetic behind ``icefloe cost``.

The counters come from each broker's ``/metrics`` (summed over brokers); a report is the
difference of two readings (the first may be "nothing", for since-start figures). Prices come
from the ``[cost]`` section. A GB here is 10^9 bytes, as cloud bills count.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

from icefloe.config.cost import CostPrices
from icefloe.config.storage import PROFILES, FlushProfile

GB: Final = 1e9
WRITE_CLASS: Final = ("PUT", "LIST")
"""Requests S3 bills at the PUT price."""
READ_CLASS: Final = ("GET", "HEAD")


@dataclass
class Counters:
    """The cluster's counters at one moment (sums over brokers)."""

    taken_at: float = 0.0
    """When read (seconds since the epoch)."""
    started_at: float = math.inf
    """When the earliest broker process started."""
    ingested_bytes: float = 0.0
    requests: dict[str, float] = field(default_factory=dict)
    request_bytes: dict[str, float] = field(default_factory=dict)
    wal_objects: float = 0.0
    wal_bytes: float = 0.0
    cross_zone_bytes: float = 0.0
    compacted_wal_bytes: float = 0.0
    compacted_parquet_bytes: float = 0.0
    brokers: int = 0

    def add_scrape(self, text: str) -> None:
        """Add one broker's ``/metrics`` page."""
        self.brokers += 1
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                self._add(sample.name, sample.labels, sample.value)

    def _add(self, name: str, labels: Mapping[str, str], value: float) -> None:
        if name == "icefloe_kafka_bytes_in_total":
            self.ingested_bytes += value
        elif name == "icefloe_object_store_requests_total":  # by the broker and compaction
            self.requests[labels["kind"]] = self.requests.get(labels["kind"], 0) + value
        elif name == "icefloe_object_store_bytes_total":
            self.request_bytes[labels["kind"]] = self.request_bytes.get(labels["kind"], 0) + value
        elif name == "icefloe_wal_flush_bytes_count":
            self.wal_objects += value
        elif name == "icefloe_wal_flush_bytes_sum":
            self.wal_bytes += value
        elif name == "icefloe_cross_zone_bytes_total":
            self.cross_zone_bytes += value
        elif name == "icefloe_compacted_wal_bytes_total":
            self.compacted_wal_bytes += value
        elif name == "icefloe_compacted_parquet_bytes_total":
            self.compacted_parquet_bytes += value
        elif name == "process_start_time_seconds":
            self.started_at = min(self.started_at, value)

    def since(self, earlier: Counters | None) -> Counters:
        """What happened between ``earlier`` (``None``: the brokers' start) and this reading."""
        if earlier is None:
            return self
        diff = Counters(taken_at=self.taken_at, started_at=earlier.taken_at, brokers=self.brokers)
        for f in dataclasses.fields(self):
            if f.name in ("taken_at", "started_at", "brokers"):
                continue
            mine, theirs = getattr(self, f.name), getattr(earlier, f.name)
            if isinstance(mine, dict):
                # A broker that restarted meanwhile counts from zero again: never negative.
                setattr(diff, f.name, {k: max(0, v - theirs.get(k, 0)) for k, v in mine.items()})
            else:
                setattr(diff, f.name, max(0.0, mine - theirs))
        return diff

    @property
    def seconds(self) -> float:
        return max(0.0, self.taken_at - self.started_at) if math.isfinite(self.started_at) else 0


@dataclass(frozen=True)
class Stored:
    """Bytes stored now, by what they are."""

    wal_bytes: int = 0
    parquet_bytes: int = 0
    other_bytes: int = 0
    """Table metadata and logs, and anything else."""

    def plus(self, key: str, size: int, wal_prefix: str) -> Stored:
        """These bytes and one more object's."""
        if key.startswith(wal_prefix):
            return dataclasses.replace(self, wal_bytes=self.wal_bytes + size)
        if key.endswith(".parquet"):
            return dataclasses.replace(self, parquet_bytes=self.parquet_bytes + size)
        return dataclasses.replace(self, other_bytes=self.other_bytes + size)

    def plus_wal(self, size: int) -> Stored:
        """These bytes and one more WAL object's, wherever the WAL keeps it."""
        return dataclasses.replace(self, wal_bytes=self.wal_bytes + size)


@dataclass(frozen=True)
class Report:
    counters: Counters
    stored: Stored | None
    prices: CostPrices
    profile: FlushProfile | None
    """The flush profile the brokers run, if known."""

    @property
    def ingested_gb(self) -> float:
        return self.counters.ingested_bytes / GB

    def request_dollars(self) -> dict[str, float]:
        prices = self.prices
        out = {}
        for kind, count in sorted(self.counters.requests.items()):
            if kind in WRITE_CLASS:
                price = prices.put_per_1000
            elif kind == "DELETE":
                price = prices.delete_per_1000
            else:
                price = prices.get_per_1000
            out[kind] = count / 1000 * price
        return out

    def cross_zone_dollars(self) -> float:
        return self.counters.cross_zone_bytes / GB * self.prices.cross_zone_per_gb

    def storage_dollars_per_month(self) -> float | None:
        if self.stored is None:
            return None
        total = self.stored.wal_bytes + self.stored.parquet_bytes + self.stored.other_bytes
        return total / GB * self.prices.storage_gb_month

    def parquet_per_ingested(self) -> float | None:
        """Parquet bytes written per WAL byte compacted (the compressed copy's share)."""
        c = self.counters
        return c.compacted_parquet_bytes / c.compacted_wal_bytes if c.compacted_wal_bytes else None

    def dollars_per_gb(self) -> dict[str, float | None]:
        """Per GB ingested: requests, cross-zone traffic, and a month of the Parquet copy."""
        gb = self.ingested_gb
        if gb == 0:
            return {"requests": None, "cross_zone": None, "storage_month": None, "total": None}
        requests = sum(self.request_dollars().values()) / gb
        cross_zone = self.cross_zone_dollars() / gb
        ratio = self.parquet_per_ingested()
        storage = None if ratio is None else ratio * self.prices.storage_gb_month
        total = requests + cross_zone + (storage or 0.0)
        return {
            "requests": requests,
            "cross_zone": cross_zone,
            "storage_month": storage,
            "total": total,
        }

    def modelled_wal_puts_per_gb(self) -> dict[str, float | None]:
        """WAL PUTs per GB each flush profile would make at this ingest rate per broker.

        A broker seals a WAL object when its flush size is buffered or its flush interval has
        passed since the first append, whichever comes first. Both profiles also seal sooner
        when their producers wait for answers (``latency`` while no flush is under way,
        ``cost`` after a quiet spell with no append), so where that happens they make more
        PUTs than modelled here: the figure is then a lower bound.
        """
        c = self.counters
        if not c.seconds or not c.brokers or not c.ingested_bytes:
            return {p.value: None for p in FlushProfile}
        rate = c.ingested_bytes / c.seconds / c.brokers  # bytes per second per broker
        out: dict[str, float | None] = {}
        for profile, defaults in PROFILES.items():
            per_object = min(defaults.flush_bytes, rate * defaults.flush_interval_s)
            out[profile.value] = GB / per_object
        return out

    def as_json(self) -> dict[str, Any]:
        c = self.counters
        return {
            "seconds": c.seconds,
            "brokers": c.brokers,
            "flush_profile": self.profile.value if self.profile else None,
            "ingested_bytes": c.ingested_bytes,
            "requests": c.requests,
            "request_bytes": c.request_bytes,
            "requests_per_gb": {k: v / self.ingested_gb for k, v in c.requests.items()}
            if self.ingested_gb
            else None,
            "request_dollars": self.request_dollars(),
            "wal_objects": c.wal_objects,
            "wal_bytes": c.wal_bytes,
            "cross_zone_bytes": c.cross_zone_bytes,
            "compacted_wal_bytes": c.compacted_wal_bytes,
            "compacted_parquet_bytes": c.compacted_parquet_bytes,
            "stored": dataclasses.asdict(self.stored) if self.stored else None,
            "storage_dollars_per_month": self.storage_dollars_per_month(),
            "dollars_per_gb": self.dollars_per_gb(),
            "modelled_wal_puts_per_gb": self.modelled_wal_puts_per_gb(),
            "prices": self.prices.model_dump(),
        }


def render(report: Report, window: str) -> list[str]:
    """The report as the lines ``icefloe cost`` prints."""
    c = report.counters
    gb = report.ingested_gb
    profile = report.profile.value if report.profile else "unknown"
    lines = [
        f"{window}: {c.brokers} broker{'s' if c.brokers != 1 else ''}, "
        f"{c.seconds:.0f} s, flush profile {profile}",
        f"ingested {_bytes(c.ingested_bytes)}"
        + (f" ({_bytes(c.ingested_bytes / c.seconds)}/s)" if c.seconds else ""),
        "",
        _row("requests", "count", "per GB", "bytes", "$"),
    ]
    dollars = report.request_dollars()
    for kind in sorted(c.requests):
        count = c.requests[kind]
        lines.append(
            _row(
                f"  {kind}",
                f"{count:,.0f}",
                f"{count / gb:,.1f}" if gb else "-",
                _bytes(c.request_bytes.get(kind, 0)),
                f"{dollars[kind]:.6f}",
            )
        )
    lines.append(
        _row(
            "  WAL objects (PUTs)",
            f"{c.wal_objects:,.0f}",
            f"{c.wal_objects / gb:,.1f}" if gb else "-",
            _bytes(c.wal_bytes),
            "",
        )
    )
    lines.append(
        _row(
            "cross-zone traffic",
            "",
            "",
            _bytes(c.cross_zone_bytes),
            f"{report.cross_zone_dollars():.6f}",
        )
    )
    if report.stored is not None:
        s = report.stored
        month = report.storage_dollars_per_month() or 0.0
        lines += [
            "",
            f"stored now: WAL {_bytes(s.wal_bytes)}, Parquet {_bytes(s.parquet_bytes)}, "
            f"table metadata and other {_bytes(s.other_bytes)}: ${month:.6f} per month",
        ]
    ratio = report.parquet_per_ingested()
    if ratio is not None:
        lines.append(f"Parquet bytes per WAL byte compacted: {ratio:.2f}")
    per_gb = report.dollars_per_gb()
    lines.append("")
    if per_gb["total"] is None:
        lines.append("$ per GB ingested: nothing ingested yet")
    else:
        lines.append(
            f"$ per GB ingested: {per_gb['total']:.6f} = requests {per_gb['requests']:.6f}"
            f" + cross-zone {per_gb['cross_zone']:.6f}"
            + (
                f" + a month of the Parquet copy {per_gb['storage_month']:.6f}"
                if per_gb["storage_month"] is not None
                else " (no compaction yet: storage not included)"
            )
        )
    modelled = report.modelled_wal_puts_per_gb()
    if all(v is not None for v in modelled.values()):
        lines.append(
            "WAL PUTs per GB each flush profile would make at this rate: "
            + ", ".join(
                f"{name} {value:,.0f} (${value / 1000 * report.prices.put_per_1000:.6f}/GB)"
                for name, value in modelled.items()
                if value is not None
            )
        )
    return lines


def chart(points: Sequence[tuple[float, float]], width: int = 60, height: int = 8) -> list[str]:
    """A terminal chart of ``(seconds, value)`` points: one column per time slot."""
    if not points:
        return []
    top = max(v for _, v in points) or 1.0
    start, end = points[0][0], points[-1][0]
    span = (end - start) or 1.0
    columns = [0.0] * width
    for t, v in points:
        columns[min(width - 1, int((t - start) / span * (width - 1)))] = v
    for i in range(1, width):  # carry each value right until the next point
        if columns[i] == 0.0:
            columns[i] = columns[i - 1]
    rows = []
    for level in range(height, 0, -1):
        threshold = top * (level - 0.5) / height
        label = f"{top * level / height:10.6f} |" if level in (height, 1) else " " * 10 + " |"
        rows.append(label + "".join("█" if c >= threshold else " " for c in columns))
    rows.append(" " * 11 + "+" + "-" * width)
    rows.append(" " * 12 + "0 s" + f"{span:.0f} s".rjust(width - 3))
    return rows


def _row(name: str, count: str, per_gb: str, moved: str, dollars: str) -> str:
    return f"{name:<22}{count:>14}{per_gb:>14}{moved:>12}{dollars:>12}"


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return f"{n:.2f} TB"
