"""The client scenario on every metadata, object-store and WAL backend: `icefloe serve` configured
by environment variables that change nothing but the backend and its connection settings."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, TopicPartition

from tests.support.bookkeeper import shared_bookkeeper
from tests.support.broker import start_icefloe
from tests.support.metadata_servers import shared_etcd, shared_oxia
from tests.support.object_servers import OPTIONS

RECORDS = 2_000
PARTITIONS = 4


def metadata_options(backend: str) -> dict[str, Any]:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    server = {"etcd": shared_etcd, "oxia": shared_oxia}[backend]()
    if backend == "etcd":
        return server.etcd_options(namespace)
    return server.oxia_options(namespace)


def object_store_options(backend: str) -> dict[str, Any]:
    return OPTIONS[backend](f"e2e-{uuid.uuid4().hex[:8]}")


def wal_options(backend: str) -> dict[str, Any]:
    return shared_bookkeeper().wal_options(f"e2e-{uuid.uuid4().hex[:8]}")


BACKENDS: list[tuple[str, str, Callable[[str], dict[str, Any]]]] = [
    ("metadata", "etcd", metadata_options),
    ("metadata", "oxia", metadata_options),
    ("object_store", "s3", object_store_options),
    ("object_store", "gcs", object_store_options),
    ("object_store", "azure", object_store_options),
    ("wal", "bookkeeper", wal_options),
]


def environment(section: str, backend: str, options: dict[str, Any]) -> dict[str, str]:
    """``ICEFLOE_<SECTION>__BACKEND`` plus one variable per connection setting."""
    env = {f"ICEFLOE_{section.upper()}__BACKEND": backend}
    for key, value in options.items():
        name = f"ICEFLOE_{section.upper()}__{backend.upper()}__{key.upper()}"
        env[name] = value if isinstance(value, str) else json.dumps(value)
    return env


@pytest.mark.parametrize(
    ("section", "backend", "options"), BACKENDS, ids=[f"{s}-{b}" for s, b, _ in BACKENDS]
)
def test_produce_and_consume_through_serve(
    tmp_path: Path, section: str, backend: str, options: Callable[[str], dict[str, Any]]
) -> None:
    env = environment(section, backend, options(backend))
    env["ICEFLOE_TABLE__FORMATS"] = "[]"  # tables on remote stores are not what this tests
    running = start_icefloe(tmp_path / "data", env=env)
    try:
        bootstrap = running.bootstrap
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("orders", PARTITIONS, 1)])["orders"].result(30)
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
        for i in range(RECORDS):
            producer.produce(
                "orders",
                key=f"k{i % 17}".encode(),
                value=f"order {i}".encode(),
                headers=[("n", str(i).encode())],
            )
        assert producer.flush(60) == 0

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        partitions = [TopicPartition("orders", p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
        values = []
        while sum(len(offsets) for offsets in seen.values()) < RECORDS:
            polled = consumer.poll(timeout_ms=10_000)
            assert polled, "no records within 10 s"
            for tp, records in polled.items():
                for r in records:
                    seen[tp.partition].append(r.offset)
                    values.append(r.value)
        consumer.close()
        assert sorted(values) == sorted(f"order {i}".encode() for i in range(RECORDS))
        for offsets in seen.values():
            assert offsets == list(range(len(offsets)))  # gapless from 0
    finally:
        assert running.stop() == 0
