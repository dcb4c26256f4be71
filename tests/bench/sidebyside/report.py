"""The table of medians: one row per measure, one column per system, Icefloe/Kafka ratios."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

KAFKA_LABEL = "Kafka 4.1.1"


@dataclass(frozen=True)
class Row:
    """One line of the table: a measure of one workload, shown with ``decimals`` digits."""

    label: str
    workload: str
    measure: str
    decimals: int = 1


def rows(rate: int) -> list[Row]:
    throttled = f"Java producer at {rate:,} records/s"
    return [
        Row("Java producer, MB/s", "java_producer", "mb_s"),
        Row("Java producer, avg latency ms", "java_producer", "avg_ms", 0),
        Row("Java producer, p50 latency ms", "java_producer", "p50_ms", 0),
        Row("Java producer, p99 latency ms", "java_producer", "p99_ms", 0),
        Row(
            "Java producer, request latency ms (client's average)",
            "java_producer",
            "request_latency_ms",
        ),
        Row("Java producer, requests", "java_producer", "requests", 0),
        Row("Java producer, server CPU s", "java_producer", "server_cpu_s"),
        Row("Java producer, broker CPU s", "java_producer", "broker_cpu_s"),
        Row("Java producer, client CPU s", "java_producer", "client_cpu_s"),
        Row(f"{throttled}, p50 latency ms", "java_throttled", "p50_ms", 0),
        Row(f"{throttled}, p99 latency ms", "java_throttled", "p99_ms", 0),
        Row(f"{throttled}, server CPU s", "java_throttled", "server_cpu_s"),
        Row("confluent-kafka producer, MB/s", "confluent_producer", "mb_s"),
        Row("confluent-kafka producer, server CPU s", "confluent_producer", "server_cpu_s"),
        Row("confluent-kafka producer, broker CPU s", "confluent_producer", "broker_cpu_s"),
        Row("confluent-kafka producer, client CPU s", "confluent_producer", "client_cpu_s"),
        Row("Java consumer from the start, MB/s", "java_consumer", "fetch_mb_s"),
        Row("Java consumer, group join ms", "java_consumer", "rebalance_ms", 0),
        Row(
            "Java consumer, fetch latency ms (client's average)",
            "java_consumer",
            "fetch_latency_ms",
        ),
        Row("Java consumer, fetch bytes (client's average)", "java_consumer", "fetch_bytes", 0),
        Row("Java consumer, server CPU s", "java_consumer", "server_cpu_s"),
        Row("Java consumer, broker CPU s", "java_consumer", "broker_cpu_s"),
        Row("Java consumer, client CPU s", "java_consumer", "client_cpu_s"),
        Row("server peak RSS, MiB", "server", "peak_rss_mib", 0),
        Row("compaction of the log into Parquet, s", "compaction", "seconds"),
        Row("compaction, server CPU s", "compaction", "server_cpu_s"),
        Row("Java consumer from Parquet, MB/s", "parquet_consumer", "fetch_mb_s"),
        Row(
            "Java consumer from Parquet, fetch latency ms (client's average)",
            "parquet_consumer",
            "fetch_latency_ms",
        ),
        Row("Java consumer from Parquet, server CPU s", "parquet_consumer", "server_cpu_s"),
        Row("Java consumer from Parquet, broker CPU s", "parquet_consumer", "broker_cpu_s"),
        Row("Java consumer from Parquet, client CPU s", "parquet_consumer", "client_cpu_s"),
    ]


def median_of(runs: list[dict[str, Any]], label: str, row: Row) -> tuple[float | None, int]:
    """(median over the runs of ``label`` that have the measure, or None; how many had it)."""
    values = [
        run["workloads"][row.workload][row.measure]
        for run in runs
        if run["label"] == label and row.measure in run["workloads"].get(row.workload, {})
    ]
    return (statistics.median(values) if values else None), len(values)


def table(runs: list[dict[str, Any]], icefloe_labels: list[str], rate: int) -> str:
    """A Markdown table of medians, with the Icefloe/Kafka ratio beside each Icefloe column."""
    rounds = max((run["round"] for run in runs), default=0)
    header = ["measure", KAFKA_LABEL]
    for label in icefloe_labels:
        header += [label, "ratio"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows(rate):
        kafka, kafka_count = median_of(runs, KAFKA_LABEL, row)
        cells = [row.label, _cell(kafka, kafka_count, rounds, row.decimals)]
        for label in icefloe_labels:
            value, count = median_of(runs, label, row)
            cells += [_cell(value, count, rounds, row.decimals), _ratio(value, kafka)]
        if any(cell != "—" for cell in cells[1:]):
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | None, count: int, rounds: int, decimals: int) -> str:
    if value is None:
        return "—"
    text = f"{value:,.{decimals}f}"
    return text if count >= rounds else f"{text} ({count} of {rounds})"


def _ratio(value: float | None, kafka: float | None) -> str:
    if value is None or not kafka:
        return "—"
    return f"{value / kafka:.2f}"
