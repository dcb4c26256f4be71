"""Typed columns in process: Avro records in the Confluent wire format, with schemas in the
registry's store, compact into typed struct columns of both tables beside the raw bytes;
a v1 → v2 change evolves both tables in place; bad records are dead letters; Kafka reads
the same bytes after compaction. pyiceberg, delta-rs and DuckDB read the tables."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import io
import json
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from click.testing import CliRunner

from icefloe import metrics
from icefloe.cli import cli
from icefloe.errors import NotFoundError
from icefloe.schemas.model import SchemaType
from icefloe.schemas.registry import Registry
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.tables import layout
from icefloe.topics.configs import KEY_SCHEMA_CONFIG, REWRITE_MIN_FILES_CONFIG, VALUE_SCHEMA_CONFIG
from icefloe.topics.registry import Topic
from tests.compaction.conftest import Parts
from tests.contract.test_table_delta import delta_table
from tests.contract.test_table_iceberg import pyiceberg_table
from tests.support.table_readers import duckdb_connection

ADDRESS = {
    "type": "record",
    "name": "Address",
    "fields": [
        {"name": "city", "type": "string"},
        {"name": "zip", "type": ["null", "string"], "default": None},
    ],
}
V1: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "int"},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2},
        },
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["NEW", "PAID"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "counts", "type": {"type": "map", "values": "long"}},
        {"name": "address", "type": ADDRESS},
        {"name": "choice", "type": ["null", "string", "long"]},
    ],
}
V2 = {
    **V1,
    "fields": [*V1["fields"], {"name": "note", "type": ["null", "string"], "default": None}],
}
UID = uuid.UUID("12345678-1234-5678-1234-567812345678")
AT = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)


def order(i: int, **more: Any) -> dict[str, Any]:
    return {
        "id": i,
        "price": decimal.Decimal(f"{i}.25"),
        "day": datetime.date(2026, 1, 2),
        "at": AT,
        "uid": UID,
        "kind": "PAID" if i % 2 else "NEW",
        "tags": [f"t{i}", "x"],
        "counts": {"a": i},
        "address": {"city": f"city{i}", "zip": None if i % 2 else f"z{i}"},
        "choice": f"s{i}" if i % 3 == 0 else i if i % 3 == 1 else None,
        **more,
    }


def encoded(schema_id: int, schema: dict[str, Any], value: dict[str, Any]) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), value)
    return b"\x00" + schema_id.to_bytes(4, "big") + out.getvalue()


async def register(
    storage: StreamStorage, schema: dict[str, Any] | str, subject: str = "orders-value"
) -> int:
    """Registers ``schema`` as a version of ``subject``, as a serializer would."""
    schema_id, _ = await Registry(storage.metadata).register(
        subject, SchemaType.AVRO, json.dumps(schema)
    )
    return schema_id


async def values(storage: StreamStorage, topic: Topic) -> list[bytes | None]:
    return [r.value for r in await storage.read_records(topic.streams[0], 0, 1 << 24)]


@pytest.fixture
def parts(table_parts: Parts) -> Parts:
    return table_parts


async def test_avro_values_become_typed_columns_that_evolve_in_both_tables(
    parts: Parts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, topics, compactor = parts
    topic = await topics.create("orders", 1, {VALUE_SCHEMA_CONFIG: "registry"})
    stream = topic.streams[0]
    v1 = await register(storage, V1)
    first = [encoded(v1, V1, order(i)) for i in range(5)]
    bad = [
        b'{"id": 1}',  # no magic byte
        b"\x00\x00\x00\x7f\xff" + first[0][5:],  # an id nobody registered
        first[0][:12],  # a payload cut short
    ]
    await storage.append(stream, [Record(0, 1000, None, v) for v in first + bad])
    dead_before = metrics.DEAD_LETTERS.labels("orders")._value.get()
    await compactor.until_idle()

    # v2 adds an optional field: the tables widen in place, old rows read it as null.
    v2 = await register(storage, V2)
    second = [encoded(v2, V2, order(i, note=f"n{i}")) for i in range(5, 8)]
    await storage.append(stream, [Record(0, 2000, None, v) for v in second])
    kafka_before = await values(storage, topic)
    await compactor.until_idle()

    assert await values(storage, topic) == kafka_before == first + bad + second
    assert metrics.DEAD_LETTERS.labels("orders")._value.get() - dead_before == 3
    # `icefloe tables` counts them too, from the data files' footers.
    monkeypatch.setenv("ICEFLOE_DATA_DIR", str(tmp_path))
    shown = await asyncio.to_thread(
        CliRunner().invoke, cli, ["tables", "--json"], obj={}, catch_exceptions=False
    )
    shown_rows = json.loads(shown.output)
    assert {(r["format"], r["dead_letters"]) for r in shown_rows} == {("iceberg", 3), ("delta", 3)}
    assert [r["dead_letter_table"]["files"] for r in shown_rows] == [1, 1]

    spec = compactor.committer.table_spec("orders")
    iceberg = pyiceberg_table(compactor.table_formats["iceberg"], spec)
    # Created; widened by the first typed file (value_fields); by the v2 file (its note).
    assert len(iceberg.schemas()) == 3
    assert "value_fields.note" in {c for c in _paths(iceberg.schema().as_arrow())}
    rows = iceberg.scan().to_arrow().sort_by("offset")
    _check_rows(rows.to_pylist())

    delta = delta_table(spec)
    # The schema changes kept the table's own metadata.
    assert delta.metadata().name == spec.name
    assert delta.metadata().partition_columns == ["partition"]
    assert "delta.logRetentionDuration" in delta.metadata().configuration
    from deltalake import QueryBuilder

    query = QueryBuilder().register("t", delta)
    delta_rows = pa.table(query.execute('SELECT * FROM t ORDER BY "offset"').read_all())
    _check_rows(delta_rows.to_pylist())

    # The dead-letter table, in both formats: where each bad record is, its bytes, why.
    letters = layout.dead_letter_spec(storage.object_store, spec, "orders")
    assert letters.identifier == "icefloe.orders_dead_letters"
    iceberg_letters = pyiceberg_table(compactor.table_formats["iceberg"], letters)
    query = QueryBuilder().register("d", delta_table(letters))
    for found in (
        iceberg_letters.scan().to_arrow(),
        pa.table(query.execute("SELECT * FROM d").read_all()),
    ):
        rows = sorted(found.to_pylist(), key=lambda r: r["offset"])
        assert [(r["partition"], r["offset"], r["value"]) for r in rows] == [
            (0, 5 + i, v) for i, v in enumerate(bad)
        ]
        assert [r["value_schema_id"] for r in rows] == [None, 0x7FFF, v1]
        assert rows[1]["value_error"] == f"unknown schema id {0x7FFF}"

    metadata_json = (await compactor.table_formats["iceberg"].ensure_table(spec)).metadata_location
    duck = duckdb_connection()
    for relation in (f"iceberg_scan('{metadata_json}')", f"delta_scan('{spec.location}')"):
        found = duck.execute(
            f'SELECT "offset", value_fields.address.city, value_fields.note, value_fields.tags[1], '
            f"value_fields.price, value_error IS NOT NULL FROM {relation} ORDER BY 1"
        ).fetchall()
        assert [r[0] for r in found] == list(range(11)), relation
        assert found[0][1:] == ("city0", None, "t0", decimal.Decimal("0.25"), False), relation
        assert found[9][1:] == ("city6", "n6", "t6", decimal.Decimal("6.25"), False), relation
        assert [r[5] for r in found] == [False] * 5 + [True] * 3 + [False] * 3, relation


def _paths(schema: pa.Schema | pa.StructType, prefix: str = "") -> list[str]:
    paths = []
    for f in schema:
        paths.append(prefix + f.name)
        if pa.types.is_struct(f.type):
            paths += _paths(f.type, f"{prefix}{f.name}.")
    return paths


def _check_rows(rows: list[dict[str, Any]]) -> None:
    assert [r["offset"] for r in rows] == list(range(11))
    typed = rows[:5] + rows[8:]
    for i, row in zip([*range(5), *range(5, 8)], typed, strict=True):
        fields = row["value_fields"]
        assert fields["id"] == i
        assert fields["price"] == decimal.Decimal(f"{i}.25")
        assert fields["day"] == datetime.date(2026, 1, 2)
        assert fields["at"] == AT
        assert fields["uid"] == str(UID)
        assert fields["kind"] == ("PAID" if i % 2 else "NEW")
        assert fields["tags"] == [f"t{i}", "x"]
        assert dict(fields["counts"]) == {"a": i}
        assert fields["address"] == {"city": f"city{i}", "zip": None if i % 2 else f"z{i}"}
        choice = fields["choice"]
        expected_choice = (
            {"string": f"s{i}", "long": None}
            if i % 3 == 0
            else {"string": None, "long": i}
            if i % 3 == 1
            else None
        )
        assert choice == expected_choice
        assert fields["note"] == (f"n{i}" if i >= 5 else None)
        assert row["value_error"] is None
        assert row["value_schema_id"] is not None
    errors = [r["value_error"] for r in rows[5:8]]
    assert [r["value_fields"] for r in rows[5:8]] == [None] * 3
    assert errors[0].startswith("not in the wire format: no magic byte")
    assert errors[1] == f"unknown schema id {0x7FFF}"
    assert "Avro payload does not decode" in errors[2]
    assert rows[5]["value_schema_id"] is None


async def test_keys_too_and_files_of_two_versions_merge_into_one(parts: Parts) -> None:
    storage, topics, compactor = parts
    configs = {VALUE_SCHEMA_CONFIG: "registry", KEY_SCHEMA_CONFIG: "registry"}
    topic = await topics.create("keyed", 1, {**configs, REWRITE_MIN_FILES_CONFIG: "2"})
    stream = topic.streams[0]
    key_id = await register(storage, "string", "keyed-key")
    v1 = await register(storage, V1, "keyed-value")
    v2 = await register(storage, V2, "keyed-value")

    def key(i: int) -> bytes:
        return b"\x00" + key_id.to_bytes(4, "big") + bytes([2 * len(f"k{i}")]) + f"k{i}".encode()

    # Three rounds, three files: v1, v2, v2 (and a key not in the wire format).
    rounds = [
        [Record(0, 1000, key(i), encoded(v1, V1, order(i))) for i in range(2)],
        [Record(0, 2000, key(i), encoded(v2, V2, order(i, note="n"))) for i in range(2, 4)],
        [
            Record(0, 3000, key(4), encoded(v2, V2, order(4, note="n"))),
            Record(0, 3000, b"raw key", encoded(v2, V2, order(5, note="n"))),
        ],
    ]
    for records in rounds:
        await storage.append(stream, records)
        await compactor.until_idle()
    kafka_before = await values(storage, topic)

    assert await compactor.rewrite_once() is not None  # the files of both versions merge
    entries = await storage.index.scan(stream)
    assert [(e.start, e.end) for e in entries] == [(0, 6)]
    assert await values(storage, topic) == kafka_before

    spec = compactor.committer.table_spec("keyed")
    rows = pyiceberg_table(compactor.table_formats["iceberg"], spec).scan().to_arrow()
    rows = rows.sort_by("offset").to_pylist()
    assert [r["key_fields"] for r in rows] == [{"value": f"k{i}"} for i in range(5)] + [None]
    assert rows[5]["key_error"].startswith("not in the wire format")
    assert [r["value_fields"]["note"] for r in rows] == [None] * 2 + ["n"] * 4
    assert [r["value_fields"]["id"] for r in rows] == list(range(6))
    for table_format in compactor.table_formats.values():
        [merged] = await table_format.files(spec)
        assert merged.record_count == 6

    # The raw key is a dead letter; deleting the topic drops its dead-letter table too.
    letters = layout.dead_letter_spec(storage.object_store, spec, "keyed")
    for table_format in compactor.table_formats.values():
        assert [f.record_count for f in await table_format.files(letters)] == [1]
    await topics.delete("keyed")
    await compactor.drop_deleted_topics()
    assert [
        i async for i in storage.object_store.list(layout.dead_letter_root("keyed") + "/")
    ] == []
    for table_format in compactor.table_formats.values():
        with pytest.raises(NotFoundError):
            await table_format.files(letters)
