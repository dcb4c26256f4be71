"""Operator endpoints of `icefloe serve`: /metrics moves with a real client scenario, /livez and
/readyz answer, and `icefloe cost` turns the counters into requests and dollars per GB."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.http import get
from tests.support.metrics import scrape, total

DOCS = Path(__file__).parents[2] / "docs"
FORMATS = ("iceberg", "delta")


@pytest.fixture
def zoned(tmp_path: Path) -> Iterator[RunningIcefloe]:
    """One broker in zone a that compacts within seconds, its WAL objects in the object store
    (so that the broker's and the compaction's object-store requests both move)."""
    running = start_icefloe(
        tmp_path / "data",
        env={
            "ICEFLOE_WAL__BACKEND": "object",
            "ICEFLOE_BROKER__ZONE": "a",
            "ICEFLOE_COMPACTOR__MAX_AGE_S": "1",
            "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
            "ICEFLOE_COMPACTOR__INTERVAL_S": "0.5",
        },
    )
    yield running
    running.stop()


def produce(bootstrap: str, topic: str, count: int, client_id: str = "metrics-test") -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id})
    for i in range(count):
        producer.produce(topic, os.urandom(200), key=str(i).encode())
    assert producer.flush(30) == 0


def create_topic(bootstrap: str, topic: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)


def test_every_metric_family_moves_during_a_client_scenario(zoned: RunningIcefloe) -> None:
    [url] = zoned.metrics_urls
    before = scrape(url)

    create_topic(zoned.bootstrap, "events")
    with pytest.raises(KafkaException, match="TOPIC_ALREADY_EXISTS"):
        create_topic(zoned.bootstrap, "events")
    produce(zoned.bootstrap, "events", 2000, client_id="producer,zone_id=b")  # another zone
    consumer = Consumer(
        {
            "bootstrap.servers": zoned.bootstrap,
            "group.id": "readers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(["events"])
    read = 0
    deadline = time.monotonic() + 60
    while read < 500 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            read += 1
    consumer.commit(asynchronous=False)  # some way short of the end: the group lags
    expected_lag = sum(
        consumer.get_watermark_offsets(p, timeout=10)[1] - p.offset
        for p in consumer.committed(consumer.assignment(), timeout=10)
        if p.offset >= 0
    )
    consumer.close()
    assert read >= 500

    deadline = time.monotonic() + 90
    after = scrape(url)
    while not (
        all(total(after, "icefloe_table_commit_seconds_count", format=f) for f in FORMATS)
        and ("icefloe_compaction_backlog_bytes", (("topic", "events"),)) in after
    ):
        assert time.monotonic() < deadline, "no table commits or backlog reported in 90 s"
        time.sleep(1)
        after = scrape(url)

    def moved(name: str, **labels: str) -> bool:
        return total(after, name, **labels) > total(before, name, **labels)

    assert moved("icefloe_kafka_request_seconds_count", api="produce")
    assert moved("icefloe_kafka_request_seconds_count", api="fetch")
    assert moved("icefloe_kafka_request_seconds_bucket", api="produce", le="+Inf")
    assert moved(
        "icefloe_kafka_request_errors_total", api="create_topics", code="topic_already_exists"
    )
    assert moved("icefloe_kafka_bytes_in_total", topic="events")
    assert moved("icefloe_kafka_bytes_out_total", topic="events")
    assert moved("icefloe_cross_zone_bytes_total", direction="in")
    assert moved("icefloe_connections_accepted_total")
    assert moved("icefloe_wal_flush_seconds_count")
    assert moved("icefloe_wal_flush_bytes_sum")
    assert (
        total(after, "icefloe_wal_records_total") - total(before, "icefloe_wal_records_total")
        == 2000
    )
    assert moved("icefloe_object_store_requests_total", kind="PUT", by="broker")
    assert moved("icefloe_object_store_requests_total", kind="GET", by="compaction")
    assert moved("icefloe_object_store_bytes_total", kind="PUT", by="compaction")
    assert moved("icefloe_metadata_op_seconds_count", op="append_sequence")
    assert moved("icefloe_index_cache_lookups_total")
    assert moved("icefloe_table_commit_seconds_count", format="iceberg")
    assert moved("icefloe_table_commit_seconds_count", format="delta")
    assert moved("icefloe_compacted_wal_bytes_total", topic="events")
    assert moved("icefloe_compacted_parquet_bytes_total", topic="events")
    assert total(after, "icefloe_compactor_open") == 1
    assert ("icefloe_compaction_backlog_bytes", (("topic", "events"),)) in after
    assert ("icefloe_compaction_backlog_age_seconds", (("topic", "events"),)) in after
    lag = total(after, "icefloe_consumer_group_lag", group="readers", topic="events")
    assert lag == expected_lag > 0
    assert moved("icefloe_event_loop_lag_seconds_count")
    assert total(after, "icefloe_memory_limit_bytes") > 0
    assert ("icefloe_memory_used_bytes", ()) in after
    assert total(after, "process_resident_memory_bytes") > 0

    # What the operations guide and the dashboard name is what brokers export.
    exported = {name for name, _ in after}
    for document in ("operations.md", "grafana-dashboard.json"):
        text = (DOCS / document).read_text()
        for documented in set(re.findall(r"icefloe_[a-z_]*[a-z]", text)):
            assert any(name.startswith(documented) for name in exported), (document, documented)


def test_liveness_and_readiness_answer(zoned: RunningIcefloe) -> None:
    base = zoned.metrics_urls[0].removesuffix("/metrics")
    assert get(f"{base}/livez")[0] == 200
    assert get(f"{base}/readyz") == (200, "ready\n")
    status, text = get(f"{base}/nothing-here")
    assert status == 404
    assert "/metrics" in text


def cost_report(data: Path, wal_backend: str) -> dict[str, Any]:
    """``icefloe cost --json`` after 3,000 records, compaction off, on the given WAL."""
    wal = {"ICEFLOE_WAL__BACKEND": wal_backend}
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false", **wal})
    try:
        create_topic(running.bootstrap, "billed")
        produce(running.bootstrap, "billed", 3000)
        done = subprocess.run(
            [sys.executable, "-m", "icefloe", "cost", "--data-dir", str(data), "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")} | wal,
        )
    finally:
        running.stop()
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_cost_counts_every_wal_object_as_a_put(tmp_path: Path) -> None:
    data = tmp_path / "data"
    report = cost_report(data, "object")
    wal_objects = [p for p in (data / "objects" / "wal").rglob("*") if p.is_file()]
    assert report["wal_objects"] == len(wal_objects) > 0
    # Nothing else writes while compaction is off: every PUT is a WAL object.
    assert report["requests"]["PUT"] == len(wal_objects)
    assert report["ingested_bytes"] > 3000 * 200
    gb = report["ingested_bytes"] / 1e9
    assert report["requests_per_gb"]["PUT"] == pytest.approx(len(wal_objects) / gb)
    assert report["dollars_per_gb"]["requests"] == pytest.approx(
        (len(wal_objects) * 0.005 + report["requests"].get("GET", 0) * 0.0004) / 1000 / gb
    )
    assert report["stored"]["wal_bytes"] == sum(p.stat().st_size for p in wal_objects)
    assert report["flush_profile"] == "latency"


def test_cost_of_the_local_wal_counts_its_objects_but_no_object_store_request(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    report = cost_report(data, "local")
    assert report["wal_objects"] > 0
    assert report["requests"].get("PUT", 0) == 0  # nothing else writes with compaction off
    assert not (data / "objects" / "wal").exists()
    # Nothing was released: the WAL holds every byte flushed.
    assert report["stored"]["wal_bytes"] == report["wal_bytes"] > 3000 * 200
    assert report["flush_profile"] == "latency"


def test_cost_without_running_brokers_says_how_to_get_figures(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = start_icefloe(data)
    running.stop()
    done = subprocess.run(
        [sys.executable, "-m", "icefloe", "cost", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no running broker serves metrics" in done.stderr
    assert "--metrics-url" in done.stderr
