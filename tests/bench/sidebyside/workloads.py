"""The workloads, each run by a client in a child process against a server's bootstrap address.

Every workload returns a flat ``{measure: number}``; :func:`measured` adds the server's CPU
seconds during the run, the client's, and the server's peak RSS so far. A workload that fails,
times out or prints something unparseable raises :class:`WorkloadError` with the raw output
that explains it.
"""

from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from tests.bench.sidebyside.kafka import Java
from tests.bench.sidebyside.procstats import (
    broker_cpu_seconds,
    broker_page_faults,
    reset_peak_rss,
    server_cpu_seconds,
    server_peak_rss_mib,
)
from tests.support.servers import ROOT

TOOL_HEAP = "512M"
PRODUCER_PROPS = ("acks=all", "linger.ms=5", "batch.size=65536")
"""On top of the Java client's defaults (idempotence is on by default since Kafka 3.0)."""

Measures = dict[str, float]


class Server(Protocol):
    """What a workload needs of a running system."""

    @property
    def bootstrap(self) -> str: ...

    def pids(self) -> list[int]:
        """The server's root processes (their descendants are counted too)."""
        ...

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the server's log, to explain a failure."""
        ...


class WorkloadError(RuntimeError):
    """A workload failed; the message carries the client's own words."""


def measured(server: Server, run: Callable[[], Measures]) -> Measures:
    """``run()``'s measures plus the wall time, server and client CPU seconds, the broker's page
    faults and the server's peak RSS (MiB). On two cores the client's CPU tells whether the
    machine, not the server, set the pace: client and server together near twice the wall
    time."""
    roots = server.pids()
    reset_peak_rss(roots)
    cpu_before = server_cpu_seconds(roots)
    broker_cpu_before = broker_cpu_seconds(roots)
    broker_faults_before = broker_page_faults(roots)
    client_cpu_before = _children_cpu_seconds()
    started = time.monotonic()
    result = run()
    result["wall_s"] = time.monotonic() - started
    result["server_cpu_s"] = server_cpu_seconds(roots) - cpu_before
    result["broker_cpu_s"] = broker_cpu_seconds(roots) - broker_cpu_before
    result["broker_page_faults"] = broker_page_faults(roots) - broker_faults_before
    # The clients run as child processes that end within run(); the servers are children too,
    # but still running, so none of theirs is counted.
    result["client_cpu_s"] = _children_cpu_seconds() - client_cpu_before
    result["server_peak_rss_mib"] = server_peak_rss_mib(roots)
    return result


def _children_cpu_seconds() -> float:
    """User and system CPU seconds of this process's ended (and waited-for) children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_tool(command: list[str], timeout: float, name: str) -> str:
    """Run a client to completion; its stdout, or a :class:`WorkloadError` with its output."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        raise WorkloadError(f"{name} timed out after {timeout:.0f} s:\n{_tail(output)}") from exc
    if done.returncode != 0:
        raise WorkloadError(
            f"{name} exited with {done.returncode}:\n{_tail(done.stdout + done.stderr)}"
        )
    if done.stderr.strip():
        _report_client_errors(name, done.stderr)
    return done.stdout


def _report_client_errors(name: str, stderr: str) -> None:
    """Print the first error lines a client logged (its warnings go to stderr)."""
    lines = [line for line in stderr.splitlines() if "ERROR" in line or "Exception" in line]
    if lines:
        shown = "\n      ".join(lines[:5])
        print(f"    {name} logged {len(lines)} error line(s), first:\n      {shown}", flush=True)


def _text(output: bytes | str | None) -> str:
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output


def _tail(output: str, lines: int = 25) -> str:
    return "\n".join(output.strip().splitlines()[-lines:])


# ProducerPerformance's last line, e.g. "1000000 records sent, 71449.0 records/sec (69.77
# MB/sec), 365.73 ms avg latency, 1137.00 ms max latency, 350 ms 50th, 758 ms 95th, 1028 ms
# 99th, 1099 ms 99.9th."
PRODUCER_SUMMARY = re.compile(
    r"(?P<records>\d+) records sent, (?P<records_s>[\d.]+) records/sec "
    r"\((?P<mb_s>[\d.]+) MB/sec\), (?P<avg_ms>[\d.]+) ms avg latency, "
    r"(?P<max_ms>[\d.]+) ms max latency, (?P<p50_ms>[\d.]+) ms 50th, "
    r"(?P<p95_ms>[\d.]+) ms 95th, (?P<p99_ms>[\d.]+) ms 99th, (?P<p999_ms>[\d.]+) ms 99.9th"
)

# Two of the client's own metrics (``--print-metrics``), e.g.
# "producer-metrics:request-latency-avg:{client-id=perf-producer-client}  : 40.848". With at most
# five requests in flight, the average request latency caps the client's throughput.
PRODUCER_METRICS = {
    "request-latency-avg": "request_latency_ms",
    "request-total": "requests",
}


def producer_performance(
    java: Java,
    server: Server,
    topic: str,
    records: int,
    record_bytes: int,
    throughput: float = -1,
    extra_props: Sequence[str] = (),
) -> Measures:
    """Kafka's ProducerPerformance: MB/s (2^20 bytes) and its latency summary. ``throughput``
    caps the records a second (-1: none); ``extra_props`` (``key=value``) come after the
    harness's, so they override them."""
    props = [f"bootstrap.servers={server.bootstrap}", *PRODUCER_PROPS, *extra_props]
    args = ["--topic", topic, "--num-records", str(records), "--record-size", str(record_bytes)]
    args += ["--throughput", str(throughput), "--print-metrics", "--producer-props", *props]
    command = java.command("org.apache.kafka.tools.ProducerPerformance", args, TOOL_HEAP)
    expected_s = records / throughput if throughput > 0 else records / 5_000
    output = run_tool(command, 120 + 2 * expected_s, "ProducerPerformance")
    return parse_producer_summary(output)


def parse_producer_summary(output: str) -> Measures:
    """The summary line's figures, and those of :data:`PRODUCER_METRICS` the output has."""
    lines = output.splitlines()
    for line in reversed(lines):
        found = PRODUCER_SUMMARY.search(line)
        if found:
            measures = {key: float(value) for key, value in found.groupdict().items()}
            break
    else:
        raise WorkloadError(f"no summary line in ProducerPerformance's output:\n{_tail(output)}")
    return measures | client_totals(lines, "producer-metrics", PRODUCER_METRICS)


def client_totals(lines: list[str], group: str, names: dict[str, str]) -> Measures:
    """The metrics ``names`` (printed name → kept name) of ``group`` that a Kafka tool's
    ``--print-metrics`` printed for the client as a whole: a line tagged with the client id
    only, not one per topic or per node."""
    metric = re.compile(
        rf"^{re.escape(group)}:(?P<name>[a-z-]+):\{{client-id=[^,}}]*\}}\s*:\s*(?P<value>[\d.]+)$"
    )
    found: Measures = {}
    for line in lines:
        match = metric.match(line.strip())
        if match and match["name"] in names:
            found[names[match["name"]]] = float(match["value"])
    return found


CONSUMER_FIELDS = {
    "data.consumed.in.MB": "mb",
    "MB.sec": "mb_s",
    "data.consumed.in.nMsg": "records",
    "nMsg.sec": "records_s",
    "rebalance.time.ms": "rebalance_ms",
    "fetch.time.ms": "fetch_ms",
    "fetch.MB.sec": "fetch_mb_s",
    "fetch.nMsg.sec": "fetch_records_s",
}
"""ConsumerPerformance's columns, and the names they are kept under."""


# Two of the consumer's own metrics (``--print-metrics``), the client's totals rather than a
# topic's, e.g. "consumer-fetch-manager-metrics:fetch-latency-avg:{client-id=perf-consumer-client}
#   : 20.3". The client keeps one fetch in flight per broker, so its latency and size, beside
# the client's own CPU, tell where a read's time goes.
CONSUMER_METRICS = {
    "fetch-latency-avg": "fetch_latency_ms",
    "fetch-size-avg": "fetch_bytes",
}


def consumer_performance(java: Java, server: Server, topic: str, records: int) -> Measures:
    """Kafka's ConsumerPerformance, a fresh group reading ``records`` from the start."""
    args = ["--bootstrap-server", server.bootstrap, "--topic", topic]
    args += ["--messages", str(records), "--group", f"sidebyside-{uuid.uuid4().hex[:12]}"]
    args += ["--timeout", "30000", "--print-metrics"]
    command = java.command("org.apache.kafka.tools.ConsumerPerformance", args, TOOL_HEAP)
    output = run_tool(command, 120 + records / 2_000, "ConsumerPerformance")
    result = parse_consumer_summary(output)
    if result["records"] < records:
        print(f"    ConsumerPerformance read {result['records']:.0f} of {records}", flush=True)
    return result


def parse_consumer_summary(output: str) -> Measures:
    """The row under ConsumerPerformance's header line (``start.time, end.time, …``), and the
    figures of :data:`CONSUMER_METRICS` the output has."""
    lines = output.splitlines()
    for i, line in enumerate(lines[:-1]):
        if not line.startswith("start.time"):
            continue
        header = [name.strip() for name in line.split(",")]
        values = [value.strip() for value in lines[i + 1].split(",")]
        row = dict(zip(header, values, strict=False))
        try:
            measures = {key: float(row[column]) for column, key in CONSUMER_FIELDS.items()}
        except (KeyError, ValueError) as exc:
            raise WorkloadError(
                f"could not read ConsumerPerformance's summary ({exc}):\n{line}\n{lines[i + 1]}"
            ) from exc
        break
    else:
        raise WorkloadError(f"no summary in ConsumerPerformance's output:\n{_tail(output)}")
    return measures | client_totals(lines, "consumer-fetch-manager-metrics", CONSUMER_METRICS)


def confluent_producer(server: Server, topic: str, records: int, record_bytes: int) -> Measures:
    """The confluent-kafka producer of :mod:`.confluent_producer`, in a child process."""
    command = [sys.executable, "-m", "tests.bench.sidebyside.confluent_producer"]
    command += ["--bootstrap", server.bootstrap, "--topic", topic, "--records", str(records)]
    command += ["--record-bytes", str(record_bytes)]
    output = run_tool(command, 120 + records / 2_000, "confluent-kafka producer")
    try:
        result = json.loads(output.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise WorkloadError(
            f"unreadable confluent-kafka producer output:\n{_tail(output)}"
        ) from exc
    if result["errors"] or result["unsent"]:
        print(
            f"    confluent-kafka producer: {result['errors']} errors, {result['unsent']} unsent; "
            f"first: {result['first_errors']}",
            flush=True,
        )
    return {k: float(v) for k, v in result.items() if isinstance(v, int | float)}


def log_end_total(server: Server, topic: str, partitions: int) -> int:
    """Records in the topic: the sum of its partitions' high watermarks."""
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "sidebyside-ends"})
    try:
        total = 0
        for partition in range(partitions):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            total += high
        return total
    except KafkaException as exc:
        raise WorkloadError(f"could not read the log end offsets of {topic}: {exc}") from exc
    finally:
        consumer.close()
