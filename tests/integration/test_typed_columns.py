"""Schema-backed topics end to end: confluent-kafka's Avro, JSON Schema and Protobuf serializers
produce through `icefloe serve` with its own schema registry; compaction decodes the records into
typed columns of both tables, which DuckDB, pyiceberg, delta-rs and Spark query, nested
fields included; Avro v1 → v2 evolves both tables; bad records of each kind are dead letters; Kafka
consumers read the same bytes before and after compaction.

One data folder is shared by the module: produced with compaction off, then served again with
compaction on (as tests/integration/test_compaction_clients.py does).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import importlib
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.integration.test_compaction_clients import compacted, tables
from tests.integration.test_spark_reads_tables import store_settings
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.spark_readers import SparkReader
from tests.support.table_readers import duckdb_connection

pytestmark = pytest.mark.slow

AVRO_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "typed",
    "fields": [
        {"name": "id", "type": "int"},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [
                    {"name": "name", "type": "string"},
                    {
                        "name": "tier",
                        "type": {"type": "enum", "name": "Tier", "symbols": ["GOLD", "BASIC"]},
                    },
                ],
            },
        },
        {
            "name": "lines",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Line",
                    "fields": [
                        {"name": "sku", "type": "string"},
                        {"name": "qty", "type": "int"},
                    ],
                },
            },
        },
        {
            "name": "total",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "coupon", "type": ["null", "string"], "default": None},
    ],
}
AVRO_V2 = {
    **AVRO_V1,
    "fields": [
        *AVRO_V1["fields"],
        {"name": "channel", "type": ["null", "string"], "default": None},
    ],
}
JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Shipment",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "to": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
        },
        "parcels": {"type": "array", "items": {"type": "number"}},
        "sent": {"type": "string", "format": "date-time"},
    },
    "required": ["id"],
}
PROTOS = {
    "typedshop/place.proto": """
syntax = "proto3";
package typedshop;
message Place { string city = 1; }
""",
    "typedshop/visit.proto": """
syntax = "proto3";
package typedshop;
import "typedshop/place.proto";
import "google/protobuf/timestamp.proto";
message Visit {
  int64 id = 1;
  Place place = 2;
  repeated string pages = 3;
  map<string, int64> seconds = 4;
  google.protobuf.Timestamp at = 5;
}
""",
}
AT = datetime.datetime(2026, 3, 4, 5, 6, 7, 890000, tzinfo=datetime.UTC)
FORMATS = ("iceberg", "delta")
TOPICS = ("avro-orders", "json-shipments", "proto-visits", "avro-changes")
CONFIG = {"icefloe.table.value.schema": "registry"}


@dataclass
class Produced:
    running: RunningIcefloe
    before: dict[str, list[tuple[int, bytes | None]]]
    after: dict[str, list[tuple[int, bytes | None]]]
    tables: dict[tuple[str, str], dict[str, Any]]
    """``icefloe tables --json`` rows by (topic, format)."""


def protobuf_module(folder: Path) -> Any:
    """The classes protoc generates for :data:`PROTOS`, as an application would have them."""
    import grpc_tools

    for name, text in PROTOS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{folder}", f"-I{well_known}"]
    subprocess.run([*command, f"--python_out={folder}", *PROTOS], check=True)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("typedshop.visit_pb2")
    finally:
        sys.path.remove(str(folder))


def order(i: int, **more: Any) -> dict[str, Any]:
    return {
        "id": i,
        "customer": {"name": f"c{i}", "tier": "GOLD" if i % 2 else "BASIC"},
        "lines": [{"sku": f"s{i}", "qty": i}, {"sku": "x", "qty": 1}],
        "total": decimal.Decimal(f"{i}.50"),
        "at": AT,
        "coupon": None if i % 3 else f"k{i}",
        **more,
    }


def produce_all(running: RunningIcefloe, folder: Path) -> None:
    bootstrap = running.broker_address(0)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(t, 1, 1, config=CONFIG) for t in TOPICS]).values():
        future.result(30)
    registry = SchemaRegistryClient({"url": running.registry_urls[0]})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})

    def send(topic: str, values: list[bytes]) -> None:
        for value in values:
            producer.produce(topic, value=value)

    # Avro: v1, the three kinds of bad records, then v2 (a new optional field).
    avro = SerializationContext("avro-orders", MessageField.VALUE)
    v1 = AvroSerializer(registry, json.dumps(AVRO_V1))
    good = [v1(order(i), avro) for i in range(20)]
    assert all(g is not None for g in good)
    send("avro-orders", good)
    header = good[0][:5]
    send(
        "avro-orders",
        [
            b'{"id": 1, "not": "in the wire format"}',
            b"\x00\x7f\xff\xff\xf0" + good[0][5:],
            header + b"\xff\xff\xff",
        ],
    )
    v2 = AvroSerializer(registry, json.dumps(AVRO_V2))
    send("avro-orders", [v2(order(i, channel=f"web{i}"), avro) for i in range(20, 30)])

    # JSON Schema, and a record its schema does not validate.
    shipments = SerializationContext("json-shipments", MessageField.VALUE)
    serialize_json = JSONSerializer(json.dumps(JSON_SCHEMA), registry)
    shipped = [
        serialize_json(
            {"id": i, "to": {"city": f"town{i}"}, "parcels": [1.5, i], "sent": AT.isoformat()},
            shipments,
        )
        for i in range(10)
    ]
    send("json-shipments", [*shipped, shipped[0][:5] + b'{"id": "not a number"}'])

    # Protobuf with an imported file (a schema reference), and a corrupt payload.
    module = protobuf_module(folder)
    visits = SerializationContext("proto-visits", MessageField.VALUE)
    serialize_proto = ProtobufSerializer(module.Visit, registry, {"use.deprecated.format": False})
    encoded = []
    for i in range(10):
        visit = module.Visit(id=i, pages=[f"/p{i}"], seconds={"home": i})
        visit.place.city = f"city{i}"
        visit.at.seconds = 1_800_000_000 + i
        encoded.append(serialize_proto(visit, visits))
    send("proto-visits", [*encoded, encoded[0][:6] + b"\xff\xff\xff"])

    # Under compatibility NONE, a version that changes a field's type: its records are dead
    # letters (the first version's type stays the column's).
    registry.set_compatibility("avro-changes-value", "NONE")
    changes = SerializationContext("avro-changes", MessageField.VALUE)
    first = {"type": "record", "name": "Change", "fields": [{"name": "n", "type": "long"}]}
    retyped = {"type": "record", "name": "Change", "fields": [{"name": "n", "type": "string"}]}
    send("avro-changes", [AvroSerializer(registry, json.dumps(first))({"n": 1}, changes)])
    send("avro-changes", [AvroSerializer(registry, json.dumps(retyped))({"n": "x"}, changes)])
    assert producer.flush(30) == 0


def consume(running: RunningIcefloe, topic: str) -> list[tuple[int, bytes | None]]:
    consumer = Consumer(
        {
            "bootstrap.servers": running.broker_address(0),
            "group.id": f"read-{topic}-{id(running)}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[tuple[int, bytes | None]] = []
    expected = {"avro-orders": 33, "json-shipments": 11, "proto-visits": 11, "avro-changes": 2}
    expected = expected[topic]
    try:
        for _ in range(240):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append((message.offset(), message.value()))
            if len(seen) == expected:
                break
    finally:
        consumer.close()
    return sorted(seen)


@pytest.fixture(scope="module")
def produced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Produced]:
    folder = tmp_path_factory.mktemp("typed")
    data = folder / "data"
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    try:
        produce_all(running, folder / "protos")
        before = {t: consume(running, t) for t in TOPICS}
    finally:
        running.stop()
    running = compacted(data)
    try:
        after = {t: consume(running, t) for t in TOPICS}
        rows = {(r["topic"], r["format"]): r for r in tables(running)}
        yield Produced(running, before, after, rows)
    finally:
        running.stop()


def test_consumers_read_the_same_bytes_before_and_after_compaction(produced: Produced) -> None:
    assert produced.before == produced.after
    assert [len(produced.after[t]) for t in TOPICS] == [33, 11, 11, 2]


def scans(produced: Produced, topic: str) -> list[str]:
    iceberg = produced.tables[(topic, "iceberg")]["metadata_location"]
    delta = produced.tables[(topic, "delta")]["location"]
    return [f"iceberg_scan('{iceberg}')", f"delta_scan('{delta}')"]


def test_avro_records_are_typed_nested_columns_across_a_schema_change(produced: Produced) -> None:
    duck = duckdb_connection()
    for relation in scans(produced, "avro-orders"):
        rows = duck.execute(
            f'SELECT "offset", value_fields.id, value_fields.customer.name, '
            f"value_fields.customer.tier, value_fields.lines[1].sku, value_fields.lines[1].qty, "
            f"value_fields.total, epoch_ms(value_fields.at), value_fields.coupon, "
            f'value_fields.channel, value_error FROM {relation} ORDER BY "offset"'
        ).fetchall()
        assert len(rows) == 33, relation
        typed = rows[:20] + rows[23:]
        for i, row in enumerate(typed):
            assert row[1:10] == (
                i,
                f"c{i}",
                "GOLD" if i % 2 else "BASIC",
                f"s{i}",
                i,
                decimal.Decimal(f"{i}.50"),
                int(AT.timestamp() * 1000),
                None if i % 3 else f"k{i}",
                f"web{i}" if i >= 20 else None,  # v1 rows read v2's field as null
            ), relation
            assert row[10] is None
    # pyiceberg and delta-rs, through the catalog and the log as any reader finds them.
    from deltalake import DeltaTable, QueryBuilder
    from pyiceberg.catalog.sql import SqlCatalog

    data = produced.running.data_dir
    catalog = SqlCatalog("icefloe", uri=f"sqlite:///{data / 'iceberg-catalog.db'}")
    iceberg = catalog.load_table(produced.tables[("avro-orders", "iceberg")]["identifier"])
    typed = iceberg.schema().find_field("value_fields").field_type
    assert "channel" in [f.name for f in typed.fields]
    scanned = iceberg.scan(selected_fields=("offset", "value_fields")).to_arrow().sort_by("offset")
    delta = DeltaTable(produced.tables[("avro-orders", "delta")]["location"])
    queried = pa.table(
        QueryBuilder()
        .register("t", delta)
        .execute('SELECT "offset", value_fields FROM t ORDER BY "offset"')
        .read_all()
    )
    for table in (scanned, queried):
        fields = table.column("value_fields").to_pylist()
        assert fields[0]["lines"] == [{"sku": "s0", "qty": 0}, {"sku": "x", "qty": 1}]
        assert fields[0]["channel"] is None
        assert fields[29]["channel"] == "web26"
        assert fields[20:23] == [None] * 3


def test_spark_reads_the_typed_nested_columns_of_both_tables(produced: Produced) -> None:
    spark = SparkReader()
    try:
        data = produced.running.data_dir
        _, iceberg_properties, warehouse = asyncio.run(store_settings("local", {}, data))
        expressions = [
            "offset",
            "value_fields.id AS id",
            "value_fields.customer.name AS name",
            "value_fields.lines[0].sku AS sku",
            "value_fields.total AS total",
            "value_fields.channel AS channel",
            "value_error IS NOT NULL AS dead",
        ]
        read = {
            "iceberg": spark.iceberg_selected(
                produced.tables[("avro-orders", "iceberg")]["identifier"],
                data / "iceberg-catalog.db",
                warehouse,
                iceberg_properties,
                expressions,
            ),
            "delta": spark.delta_selected(
                produced.tables[("avro-orders", "delta")]["location"], expressions
            ),
        }
    finally:
        spark.close()
    for table_format, rows in read.items():
        assert len(rows) == 33, table_format
        assert [r["dead"] for r in rows[20:23]] == [True] * 3, table_format
        for i, row in enumerate(rows[:20] + rows[23:]):
            assert (row["id"], row["name"], row["sku"], row["total"], row["channel"]) == (
                i,
                f"c{i}",
                f"s{i}",
                decimal.Decimal(f"{i}.50"),
                f"web{i}" if i >= 20 else None,  # v1 rows read v2's field as null
            ), (table_format, row)
            assert not row["dead"]


def test_json_schema_and_protobuf_records_are_typed_columns(produced: Produced) -> None:
    duck = duckdb_connection()
    for relation in scans(produced, "json-shipments"):
        rows = duck.execute(
            f"SELECT value_fields.id, value_fields.to.city, value_fields.parcels, "
            f'epoch_ms(value_fields.sent), value_error FROM {relation} ORDER BY "offset"'
        ).fetchall()
        assert rows[:10] == [
            (i, f"town{i}", [1.5, float(i)], int(AT.timestamp() * 1000), None) for i in range(10)
        ], relation
        assert rows[10][:4] == (None, None, None, None)
        assert "does not match the schema at id" in rows[10][4]
    for relation in scans(produced, "proto-visits"):
        rows = duck.execute(
            f"SELECT value_fields.id, value_fields.place.city, value_fields.pages, "
            f"map_extract(value_fields.seconds, 'home')[1], epoch(value_fields.at), value_error "
            f'FROM {relation} ORDER BY "offset"'
        ).fetchall()
        assert rows[:10] == [
            (i, f"city{i}", [f"/p{i}"], i, 1_800_000_000 + i, None) for i in range(10)
        ], relation
        assert "Protobuf payload does not decode" in rows[10][5]


def test_bad_records_of_each_kind_are_dead_letters_counted_and_kept(produced: Produced) -> None:
    duck = duckdb_connection()
    # The topic's dead-letter table, in both formats, holds them; so does the topic's table.
    letters = {f: produced.tables[("avro-orders", f)]["dead_letter_table"] for f in FORMATS}
    dead_letter_scans = [
        f"iceberg_scan('{letters['iceberg']['metadata_location']}')",
        f"delta_scan('{letters['delta']['location']}')",
    ]
    for relation in [*dead_letter_scans, *scans(produced, "avro-orders")]:
        dead = duck.execute(
            f'SELECT "partition", "offset", value, value_schema_id, value_error FROM {relation} '
            f'WHERE value_error IS NOT NULL ORDER BY "offset"'
        ).fetchall()
        assert [row[1] for row in dead] == [20, 21, 22], relation
        raw = dict(produced.after["avro-orders"])
        assert [row[2] for row in dead] == [raw[20], raw[21], raw[22]]  # the bytes, unchanged
        assert dead[0][3] is None
        assert dead[0][4].startswith("not in the wire format: no magic byte")
        assert dead[1][3:] == (0x7FFFFFF0, f"unknown schema id {0x7FFFFFF0}")
        assert "Avro payload does not decode" in dead[2][4]
    counts = {topic: produced.tables[(topic, "delta")]["dead_letters"] for topic in TOPICS}
    assert counts == {"avro-orders": 3, "json-shipments": 1, "proto-visits": 1, "avro-changes": 1}
    with urllib.request.urlopen(produced.running.metrics_urls[0], timeout=10) as response:
        text = response.read().decode()
    exported = {
        line.split('topic="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("icefloe_dead_letters_total{")
    }
    assert exported == {k: float(v) for k, v in counts.items()}
    for relation in scans(produced, "avro-changes"):
        rows = duck.execute(
            f'SELECT value_fields.n, value_error FROM {relation} ORDER BY "offset"'
        ).fetchall()
        assert rows[0] == (1, None), relation
        assert rows[1][0] is None
        assert "does not fit the column: field n is int64 in one schema and string" in rows[1][1]
