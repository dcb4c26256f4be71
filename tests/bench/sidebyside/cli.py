"""The command: rounds of Kafka and Icefloe interleaved, a table of medians, raw JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from tests.bench.sidebyside import icefloe_server
from tests.bench.sidebyside.kafka import (
    DEFAULT_LIB,
    KAFKA_VERSION,
    Java,
    SetupError,
    create_kafka_topic,
    find_java,
    start_kafka,
)
from tests.bench.sidebyside.report import KAFKA_LABEL, table
from tests.bench.sidebyside.workloads import (
    Measures,
    Server,
    confluent_producer,
    consumer_performance,
    log_end_total,
    measured,
    producer_performance,
)
from tests.support.object_servers import icefloe_on_minio
from tests.support.servers import ROOT
from tests.support.topics import create_topic

TOPIC = "sidebyside"
RECORD_BYTES = 1024
FAILURES = (RuntimeError, OSError, subprocess.SubprocessError)
"""What a step may raise that the harness records and survives (WorkloadError, SetupError,
a broker that does not start, a timeout)."""

FULL = {"rounds": 3, "records": 1_000_000, "rate_seconds": 10.0, "confluent_records": 500_000}
QUICK = {"rounds": 1, "records": 20_000, "rate_seconds": 3.0, "confluent_records": 20_000}


@dataclass(frozen=True)
class Settings:
    """Everything a round needs to know, as given on the command line."""

    rounds: int
    profiles: list[str]
    brokers: int
    records: int
    rate: int
    rate_seconds: float
    confluent_records: int
    partitions: int
    systems: list[str]
    parquet: bool
    kafka_heap: str
    kafka_lib: str
    icefloe_env: dict[str, str]
    """Settings for `icefloe serve` (``ICEFLOE_…`` variables), to compare configurations."""
    cold_read: bool = False
    """Icefloe's consumer reads after a restart, from the WAL with nothing cached."""
    store: str = "local"
    """Icefloe's object store: ``local`` (the embedded default) or ``minio`` (S3, started
    here)."""
    producer_props: tuple[str, ...] = ()
    """Java producer settings (``key=value``) on top of the harness's, for both systems."""
    icefloe_producer_props: tuple[str, ...] = ()
    """Java producer settings for Icefloe only, after ``producer_props``: settings that suit a
    store, against Kafka as its users run it."""

    def producer_props_for(self, system: str) -> tuple[str, ...]:
        if system == "icefloe":
            return self.producer_props + self.icefloe_producer_props
        return self.producer_props

    def plan(self) -> list[tuple[str, str | None]]:
        """(system, Icefloe profile) in the order one round runs them."""
        plan: list[tuple[str, str | None]] = []
        if "kafka" in self.systems:
            plan.append(("kafka", None))
        if "icefloe" in self.systems:
            plan += [("icefloe", profile) for profile in self.profiles]
        return plan


def parse_args(argv: list[str] | None) -> tuple[Settings, Path, Path | None]:
    """(settings, where to write the JSON, an earlier JSON to only print the table of)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.bench.sidebyside",
        description="Icefloe and Apache Kafka 4.1.1 side by side: the same clients and "
        "workloads against each, interleaved, medians and Icefloe/Kafka ratios.",
    )
    parser.add_argument("--rounds", type=int, help="Kafka/Icefloe rounds (3; --quick: 1)")
    parser.add_argument(
        "--profiles",
        default="cost,latency",
        help="Icefloe flush profiles to run, comma-separated (default: cost,latency)",
    )
    parser.add_argument("--brokers", type=int, default=1, help="Icefloe brokers (default 1)")
    parser.add_argument(
        "--records", type=int, help="Java producer records (1,000,000; --quick: 20,000)"
    )
    parser.add_argument("--rate", type=int, default=5_000, help="throttled producer records/s")
    parser.add_argument(
        "--rate-seconds", type=float, help="how long the throttled producer runs (10; --quick: 3)"
    )
    parser.add_argument(
        "--confluent-records",
        type=int,
        help="confluent-kafka producer records (500,000; --quick: 20,000)",
    )
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--systems", default="kafka,icefloe", help="kafka, icefloe or both (default)"
    )
    parser.add_argument(
        "--no-parquet",
        action="store_true",
        help="skip Icefloe's compaction into Parquet and the consumer reading it",
    )
    parser.add_argument(
        "--cold-read",
        action="store_true",
        help="restart Icefloe (compaction held off) before its consumer reads the log",
    )
    parser.add_argument("--kafka-heap", default="1G", help="the Kafka broker's -Xmx (and -Xms)")
    parser.add_argument(
        "--kafka-lib",
        default=str(DEFAULT_LIB),
        help="where Kafka's jars are cached (fetched with Maven on first use)",
    )
    icefloe_server.add_icefloe_env(
        parser, "a setting for `icefloe serve`, as an environment variable"
    )
    parser.add_argument(
        "--store",
        choices=("local", "minio"),
        default="local",
        help="Icefloe's object store: the local one (default) or S3 on a MinIO started here",
    )
    parser.add_argument(
        "--producer-prop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Java producer setting for both systems, over the harness's (repeatable)",
    )
    parser.add_argument(
        "--icefloe-producer-prop",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Java producer setting for Icefloe only, after --producer-prop (repeatable)",
    )
    parser.add_argument("--json", type=Path, help="raw results (default: .benchmarks/…)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--report", type=Path, metavar="JSON", help="only print the table of an earlier run"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    profiles = [p.strip() for p in args.profiles.split(",") if p.strip()]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    for profile in profiles:
        if profile not in ("cost", "latency"):
            parser.error(f"unknown profile {profile!r} (cost or latency)")
    for system in systems:
        if system not in ("kafka", "icefloe"):
            parser.error(f"unknown system {system!r} (kafka or icefloe)")
    for option, items in (
        ("--producer-prop", args.producer_prop),
        ("--icefloe-producer-prop", args.icefloe_producer_prop),
    ):
        for item in items:
            key, sep, _ = item.partition("=")
            if not sep or not key or key == "bootstrap.servers":
                parser.error(f"{option} {item!r}: expected KEY=VALUE (not bootstrap.servers)")
    settings = Settings(
        rounds=args.rounds or int(sizes["rounds"]),
        profiles=profiles,
        brokers=args.brokers,
        records=args.records or int(sizes["records"]),
        rate=args.rate,
        rate_seconds=args.rate_seconds or sizes["rate_seconds"],
        confluent_records=args.confluent_records or int(sizes["confluent_records"]),
        partitions=args.partitions,
        systems=systems,
        parquet=not args.no_parquet,
        kafka_heap=args.kafka_heap,
        kafka_lib=args.kafka_lib,
        icefloe_env=dict(args.icefloe_env),
        cold_read=args.cold_read,
        store=args.store,
        producer_props=tuple(args.producer_prop),
        icefloe_producer_props=tuple(args.icefloe_producer_prop),
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path = args.json or ROOT / ".benchmarks" / f"sidebyside-{stamp}.json"
    return settings, json_path, args.report


def label_of(system: str, profile: str | None) -> str:
    return KAFKA_LABEL if system == "kafka" else f"Icefloe {profile}"


def step(result: dict[str, Any], name: str, server: Server, run: Callable[[], Measures]) -> bool:
    """Run one measured workload into ``result``; a failure is recorded, printed and survived."""
    try:
        measures = measured(server, run)
    except FAILURES as exc:
        message = str(exc)
        if not server.pids():
            message += f"\n(the server is gone; the end of its log:)\n{server.log_tail()}"
        result["errors"][name] = message
        print(f"    {name}: FAILED: {message}", flush=True)
        return False
    result["workloads"][name] = measures
    shown = ", ".join(f"{k} {measures[k]:,.1f}" for k in SHOWN if k in measures)
    print(f"    {name}: {shown}", flush=True)
    return True


SHOWN = (
    "mb_s",
    "fetch_mb_s",
    "avg_ms",
    "p50_ms",
    "p99_ms",
    "rebalance_ms",
    "records",
    "seconds",
    "server_cpu_s",
    "client_cpu_s",
    "server_peak_rss_mib",
)


def producers_and_consumer(
    settings: Settings, java: Java, server: Server, result: dict[str, Any]
) -> None:
    """The workloads both systems run, in order: three producers, then one consumer."""
    producers(settings, java, server, result)
    consumer(java, server, result)


def producers(settings: Settings, java: Java, server: Server, result: dict[str, Any]) -> None:
    records, rate = settings.records, settings.rate
    throttled = int(rate * settings.rate_seconds)
    props = settings.producer_props_for(result["system"])
    step(
        result,
        "java_producer",
        server,
        lambda: producer_performance(java, server, TOPIC, records, RECORD_BYTES, extra_props=props),
    )
    step(
        result,
        "java_throttled",
        server,
        lambda: producer_performance(java, server, TOPIC, throttled, RECORD_BYTES, rate, props),
    )
    step(
        result,
        "confluent_producer",
        server,
        lambda: confluent_producer(server, TOPIC, settings.confluent_records, RECORD_BYTES),
    )
    result["records_in_topic"] = log_end_total(server, TOPIC, settings.partitions)


def consumer(java: Java, server: Server, result: dict[str, Any]) -> None:
    total = result["records_in_topic"]
    step(result, "java_consumer", server, lambda: consumer_performance(java, server, TOPIC, total))
    peaks = [w["server_peak_rss_mib"] for w in result["workloads"].values()]
    result["workloads"]["server"] = {"peak_rss_mib": max(peaks, default=0.0)}


def kafka_round(settings: Settings, java: Java, workdir: Path, result: dict[str, Any]) -> None:
    broker = start_kafka(java, workdir, settings.kafka_heap)
    try:
        create_kafka_topic(broker.bootstrap, TOPIC, settings.partitions)
        producers_and_consumer(settings, java, broker, result)
    finally:
        broker.stop()


def icefloe_round(
    settings: Settings, java: Java, workdir: Path, profile: str, result: dict[str, Any]
) -> None:
    """The common workloads; then, on a restart that compacts at once, a read from Parquet."""
    data = workdir / "data"
    env = settings.icefloe_env
    if settings.store == "minio":  # a fresh prefix: each round starts on an empty store
        env = icefloe_on_minio(f"sidebyside-{time.time_ns()}") | env
    server = icefloe_server.start(data, profile, settings.brokers, env)
    try:
        create_topic(server.running, TOPIC, settings.partitions)
        if not settings.cold_read:
            producers_and_consumer(settings, java, server, result)
        else:
            producers(settings, java, server, result)
            server.stop()
            # Restarted with compaction held off: the consumer reads the WAL, nothing cached.
            held_off = env | {"ICEFLOE_COMPACTOR__ENABLED": "false"}
            server = icefloe_server.start(data, profile, settings.brokers, held_off)
            consumer(java, server, result)
    finally:
        server.stop()
    if not settings.parquet or "records_in_topic" not in result:
        return
    total = result["records_in_topic"]
    server = icefloe_server.start(data, profile, settings.brokers, env, compact_at_once=True)
    try:
        wait = 300 + total / 1_000
        compacted = step(
            result,
            "compaction",
            server,
            lambda: {"seconds": icefloe_server.wait_until_compacted(data, TOPIC, wait, env)},
        )
        if compacted:
            step(
                result,
                "parquet_consumer",
                server,
                lambda: consumer_performance(java, server, TOPIC, total),
            )
    finally:
        server.stop()


def run_one(
    settings: Settings, java: Java, system: str, profile: str | None, round_no: int
) -> dict[str, Any]:
    """One system's share of a round, in a fresh temporary folder; never raises for a failure."""
    label = label_of(system, profile)
    result: dict[str, Any] = {
        "round": round_no,
        "system": system,
        "profile": profile,
        "label": label,
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "loadavg_before": os.getloadavg(),
        "workloads": {},
        "errors": {},
    }
    print(f"[round {round_no}/{settings.rounds}] {label} (load {os.getloadavg()[0]:.2f})")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"sidebyside-{system}-") as scratch:
        try:
            if system == "kafka":
                kafka_round(settings, java, Path(scratch), result)
            else:
                assert profile is not None
                icefloe_round(settings, java, Path(scratch), profile, result)
        except FAILURES as exc:
            result["errors"]["round"] = str(exc)
            print(f"    FAILED: {exc}", flush=True)
    result["wall_s"] = time.monotonic() - started
    return result


def metadata(settings: Settings, java: Java) -> dict[str, Any]:
    return {
        "command": "python -m tests.bench.sidebyside " + " ".join(sys.argv[1:]),
        "settings": asdict(settings),
        "record_bytes": RECORD_BYTES,
        "kafka_version": KAFKA_VERSION,
        "icefloe_version": version("icefloe"),
        "java": java.version(),
        "cpus": os.cpu_count(),
        "loadavg_at_start": os.getloadavg(),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
    }


def write_json(path: Path, meta: dict[str, Any], runs: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=2) + "\n")


def print_report(path: Path) -> None:
    saved = json.loads(path.read_text())
    settings = saved["meta"]["settings"]
    labels = [label_of("icefloe", p) for p in settings["profiles"]]
    print(table(saved["runs"], labels, settings["rate"]))


def main(argv: list[str] | None = None) -> int:
    settings, json_path, earlier = parse_args(argv)
    if earlier is not None:
        print_report(earlier)
        return 0
    try:
        java = find_java(Path(settings.kafka_lib))
    except SetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    meta = metadata(settings, java)
    runs: list[dict[str, Any]] = []
    started = time.monotonic()
    for round_no in range(1, settings.rounds + 1):
        for system, profile in settings.plan():
            runs.append(run_one(settings, java, system, profile, round_no))
            write_json(json_path, meta, runs)  # partial results survive an interruption
    meta["wall_s"] = time.monotonic() - started
    meta["loadavg_at_end"] = os.getloadavg()
    write_json(json_path, meta, runs)
    labels = [label_of("icefloe", p) for p in settings.profiles if "icefloe" in settings.systems]
    print()
    print(table(runs, labels, settings.rate))
    print(f"\n{len(runs)} runs in {meta['wall_s'] / 60:.1f} min; raw results in {json_path}")
    failed = sum(1 for run in runs if run["errors"])
    if failed:
        print(f"{failed} run(s) had failures; see 'errors' in the JSON", file=sys.stderr)
    return 1 if failed else 0
