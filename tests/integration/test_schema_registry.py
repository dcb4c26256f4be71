"""The schema registry `icefloe serve` runs, through confluent-kafka's own registry client and
its Avro, JSON Schema and Protobuf serializers: records produced through Icefloe's Kafka port
with one broker's registry and consumed with the other broker's, the registry calls the
clients make, compatibility refusals, modes, configs, deletes and references.

One two-broker `serve` is shared by the module; each test uses subjects of its own.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.topics import create_topic

pytestmark = pytest.mark.slow

CONTENT = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


@pytest.fixture(scope="module")
def icefloe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("registry") / "data", brokers=2)
    yield running
    running.stop()


def registries(icefloe: RunningIcefloe) -> tuple[SchemaRegistryClient, SchemaRegistryClient]:
    """A client of each broker's registry."""
    first, second = icefloe.registry_urls
    return SchemaRegistryClient({"url": first}), SchemaRegistryClient({"url": second})


def round_trip(
    icefloe: RunningIcefloe,
    topic: str,
    values: list[Any],
    serialize: Callable[[Any, SerializationContext], bytes | None],
    deserialize: Callable[[bytes | None, SerializationContext], Any],
) -> list[Any]:
    """Produce ``values`` serialized, consume them back deserialized."""
    create_topic(icefloe, topic)
    producer = Producer({"bootstrap.servers": icefloe.broker_address(0)})
    context = SerializationContext(topic, MessageField.VALUE)
    for value in values:
        producer.produce(topic, value=serialize(value, context))
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": icefloe.broker_address(1),
            "group.id": f"{topic}-reader",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    read: list[Any] = []
    try:
        for _ in range(120):
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            read.append(deserialize(message.value(), context))
            if len(read) == len(values):
                break
    finally:
        consumer.close()
    return read


def record(fields: list[dict[str, Any]], name: str = "Click") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "shop", "fields": fields})


def test_avro_records_through_kafka_and_the_registry_calls_serializers_make(
    icefloe: RunningIcefloe,
) -> None:
    first, second = registries(icefloe)
    v1 = record([{"name": "page", "type": "string"}, {"name": "ms", "type": "long"}])
    values = [{"page": f"/p/{i}", "ms": 1000 + i} for i in range(5)]
    read = round_trip(
        icefloe,
        "avro-clicks",
        values,
        AvroSerializer(first, v1),
        AvroDeserializer(second),
    )
    assert read == values

    latest = second.get_latest_version("avro-clicks-value")
    assert latest.version == 1
    assert (
        second.get_schema(latest.schema_id).schema_str
        == first.get_schema(latest.schema_id).schema_str
    )
    # The same schema again: the same id and version; under another subject: the same id.
    assert first.register_schema("avro-clicks-value", Schema(v1, "AVRO")) == latest.schema_id
    assert second.register_schema("other-value", Schema(v1, "AVRO")) == latest.schema_id
    found = first.lookup_schema("avro-clicks-value", Schema(v1, "AVRO"))
    assert (found.schema_id, found.version) == (latest.schema_id, 1)

    # BACKWARD (the default): a type change is refused, a new field with a default is not.
    changed = record([{"name": "page", "type": "int"}, {"name": "ms", "type": "long"}])
    assert not first.test_compatibility("avro-clicks-value", Schema(changed, "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        second.register_schema("avro-clicks-value", Schema(changed, "AVRO"))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    added = record(
        [
            {"name": "page", "type": "string"},
            {"name": "ms", "type": "long"},
            {"name": "referrer", "type": ["null", "string"], "default": None},
        ]
    )
    assert first.test_compatibility("avro-clicks-value", Schema(added, "AVRO"))
    v2 = second.register_schema("avro-clicks-value", Schema(added, "AVRO"))
    assert v2 != latest.schema_id
    assert first.get_versions("avro-clicks-value") == [1, 2]
    # Records of version 1 still read, with version 2 as the reader's schema.
    evolved = AvroDeserializer(second, added)
    context = SerializationContext("avro-clicks", MessageField.VALUE)
    old = AvroSerializer(first, v1)(values[0], context)
    assert evolved(old, context) == {**values[0], "referrer": None}

    with pytest.raises(SchemaRegistryError) as missing:
        first.get_schema(999999)
    assert missing.value.error_code == 40403


def test_json_schema_records_through_kafka(icefloe: RunningIcefloe) -> None:
    first, second = registries(icefloe)
    order: dict[str, Any] = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Order",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "id": {"type": "integer"},
            "items": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["id"],
    }
    schema = json.dumps(order)
    values = [{"id": i, "items": ["a"] * i} for i in range(4)]
    read = round_trip(
        icefloe,
        "json-orders",
        values,
        JSONSerializer(schema, first),
        JSONDeserializer(None, schema_registry_client=second),
    )
    assert read == values
    # A closed object may gain an optional property; an integer may not become a string.
    optional = json.loads(schema)
    optional["properties"]["note"] = {"type": "string"}
    assert first.test_compatibility("json-orders-value", Schema(json.dumps(optional), "JSON"))
    narrowed = json.loads(schema)
    narrowed["properties"]["id"] = {"type": "string"}
    assert not first.test_compatibility("json-orders-value", Schema(json.dumps(narrowed), "JSON"))


PROTOS = {
    "shop/address.proto": """
syntax = "proto3";
package shop;
message Address { string city = 1; int32 zip = 2; }
""",
    "shop/customer.proto": """
syntax = "proto3";
package shop;
import "shop/address.proto";
import "google/protobuf/timestamp.proto";
message Customer {
  string name = 1;
  repeated Address addresses = 2;
  google.protobuf.Timestamp since = 3;
  map<string, int64> points = 4;
}
""",
}


def generated_module(folder: Path) -> Any:
    """Python classes protoc generates for :data:`PROTOS`, as an application would have them."""
    for name, text in PROTOS.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    import grpc_tools

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{folder}",
            f"-I{well_known}",
            f"--python_out={folder}",
            *PROTOS,
        ],
        check=True,
    )
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("shop.customer_pb2")
    finally:
        sys.path.remove(str(folder))


def test_protobuf_records_with_an_import_through_kafka(
    icefloe: RunningIcefloe, tmp_path: Path
) -> None:
    first, second = registries(icefloe)
    module = generated_module(tmp_path)
    values = []
    for i in range(3):
        customer = module.Customer(name=f"c{i}", points={"x": i})
        customer.addresses.add(city="Oslo", zip=i)
        customer.since.seconds = 1_700_000_000 + i
        values.append(customer)
    read = round_trip(
        icefloe,
        "proto-customers",
        values,
        ProtobufSerializer(module.Customer, first),
        ProtobufDeserializer(module.Customer),
    )
    assert read == values
    # The serializer registered the imported file as a subject of its own, referenced.
    latest = second.get_latest_version("proto-customers-value")
    assert [r.name for r in latest.schema.references] == ["shop/address.proto"]
    address = second.get_latest_version("shop/address.proto")
    assert second.get_referenced_by("shop/address.proto", address.version) == [latest.schema_id]
    with pytest.raises(SchemaRegistryError) as referenced:
        second.delete_subject("shop/address.proto")
    assert referenced.value.error_code == 42206
    # The serializer registered base64 of the descriptor, and the deserializer read that form
    # (format=serialized); other readers get it as .proto text, as from Confluent's registry.
    shown = requests.get(f"{icefloe.registry_urls[1]}/schemas/ids/{latest.schema_id}", timeout=10)
    assert shown.json()["schemaType"] == "PROTOBUF"
    assert 'import "shop/address.proto";' in shown.json()["schema"]
    assert "map<string, int64> points = 4;" in shown.json()["schema"]
    # Changing a field's type is refused, reusing a removed field's number too.
    changed = PROTOS["shop/customer.proto"].replace("string name = 1", "int64 name = 1")
    refs = [SchemaReference("shop/address.proto", "shop/address.proto", address.version)]
    assert not first.test_compatibility("proto-customers-value", Schema(changed, "PROTOBUF", refs))
    renamed = PROTOS["shop/customer.proto"].replace(
        "string name = 1;", "string full_name = 1; string nickname = 5;"
    )
    assert first.test_compatibility("proto-customers-value", Schema(renamed, "PROTOBUF", refs))


def test_avro_reference_to_a_named_type_of_another_subject(icefloe: RunningIcefloe) -> None:
    first, _ = registries(icefloe)
    money = json.dumps(
        {
            "type": "record",
            "name": "Money",
            "namespace": "pay",
            "fields": [{"name": "cents", "type": "long"}],
        }
    )
    first.register_schema("pay.Money", Schema(money, "AVRO"))
    payment = record([{"name": "amount", "type": "pay.Money"}], name="Payment")
    reference = SchemaReference("pay.Money", "pay.Money", 1)
    schema_id = first.register_schema("payments-value", Schema(payment, "AVRO", [reference]))
    fetched = first.get_schema(schema_id)
    assert [r.name for r in fetched.references] == ["pay.Money"]
    with pytest.raises(SchemaRegistryError) as unresolved:
        first.register_schema("lonely-value", Schema(payment, "AVRO"))
    assert unresolved.value.error_code == 42201


def test_config_modes_and_deletes_through_the_client(icefloe: RunningIcefloe) -> None:
    first, second = registries(icefloe)
    url = icefloe.registry_urls[0]
    assert first.get_compatibility() == "BACKWARD"
    first.set_compatibility("cfg-value", "NONE")
    assert second.get_compatibility("cfg-value") == "NONE"
    ids = [
        first.register_schema("cfg-value", Schema(record([{"name": n, "type": "int"}]), "AVRO"))
        for n in ("a", "b", "c")
    ]
    assert first.get_versions("cfg-value") == [1, 2, 3]

    # Soft delete, then permanent; never permanent first.
    with pytest.raises(SchemaRegistryError) as not_soft:
        first.delete_version("cfg-value", 1, permanent=True)
    assert not_soft.value.error_code == 40407
    assert first.delete_version("cfg-value", 1) == 1
    assert second.get_versions("cfg-value") == [2, 3]
    assert first.delete_version("cfg-value", 1, permanent=True) == 1
    assert second.get_schema(ids[0]).schema_str  # ids outlive their versions

    # READONLY refuses writes; IMPORT takes a schema under the id it had elsewhere.
    second.update_mode("cfg-value", "READONLY")
    assert first.get_mode("cfg-value") == "READONLY"
    with pytest.raises(SchemaRegistryError) as read_only:
        first.register_schema("cfg-value", Schema(record([{"name": "d", "type": "int"}]), "AVRO"))
    assert read_only.value.error_code == 42205
    with pytest.raises(SchemaRegistryError) as not_empty:
        first.update_mode("cfg-value", "IMPORT")
    assert not_empty.value.error_code == 42205
    first.update_mode("cfg-value", "IMPORT", force=True)
    imported = record([{"name": "e", "type": "int"}])
    answer = requests.post(
        f"{url}/subjects/cfg-value/versions",
        json={"schema": imported, "id": 424242, "version": 9},
        headers=CONTENT,
        timeout=10,
    )
    assert answer.json() == {"id": 424242, "version": 9}
    assert second.get_schema(424242).schema_str
    first.delete_mode("cfg-value")
    no_mode = requests.get(f"{url}/mode/cfg-value", timeout=10)
    assert (no_mode.status_code, no_mode.json()["error_code"]) == (404, 40409)
    with_global = requests.get(f"{url}/mode/cfg-value?defaultToGlobal=true", timeout=10)
    assert with_global.json() == {"mode": "READWRITE"}

    assert first.delete_subject("cfg-value") == [2, 3, 9]
    assert "cfg-value" not in second.get_subjects()
    assert "cfg-value" in second.get_subjects(deleted=True)
    assert first.delete_subject("cfg-value", permanent=True) == [2, 3, 9]
    assert "cfg-value" not in second.get_subjects(deleted=True)
    # The subject's compatibility level went with it.
    with pytest.raises(SchemaRegistryError) as no_level:
        second.get_compatibility("cfg-value")
    assert no_level.value.error_code == 40408


def test_two_brokers_registering_at_once_agree_on_every_id(icefloe: RunningIcefloe) -> None:
    clients = registries(icefloe)
    schemas = [record([{"name": f"f{i}", "type": "string"}], name=f"Race{i}") for i in range(6)]
    found: list[dict[int, int]] = [{}, {}, {}, {}]

    def register(slot: int) -> None:
        client = clients[slot % 2]
        for i, schema in enumerate(schemas):
            found[slot][i] = client.register_schema(f"race-{i}-value", Schema(schema, "AVRO"))

    threads = [threading.Thread(target=register, args=(slot,)) for slot in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(f == found[0] for f in found), found
    assert len(set(found[0].values())) == len(schemas)
    for i in range(len(schemas)):
        assert clients[1].get_versions(f"race-{i}-value") == [1]


def test_a_flood_of_large_bad_requests_leaves_the_registry_small_and_serving(
    icefloe: RunningIcefloe,
) -> None:
    url = icefloe.registry_urls[0]
    pids = broker_pids(icefloe)

    def rss_mib() -> float:
        """Of both brokers, whichever serves the registry at ``url``."""
        total = 0
        for pid in pids:
            total += int(Path(f"/proc/{pid}/status").read_text().split("VmRSS:")[1].split()[0])
        return total / 1024

    before = rss_mib()
    body = json.dumps({"schema": "{" + "x" * (1 << 20)}).encode()  # 1 MiB: over the schema limit
    codes: list[int] = []

    def send() -> None:
        for _ in range(4):
            answer = requests.post(
                f"{url}/subjects/flood/versions", data=body, headers=CONTENT, timeout=60
            )
            codes.append(answer.json()["error_code"])

    threads = [threading.Thread(target=send) for _ in range(48)]
    peak = before
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_mib())
        time.sleep(0.05)
    # Measured: about 85 MiB more at the peak of 48 such bodies at once, 5 MiB after: nothing
    # of a body is kept once it is answered. The allocator keeps freed pages until the
    # broker's heap trimmer has looked (once a second).
    deadline = time.monotonic() + 10
    while (after := rss_mib()) - before >= 32 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert peak - before < 200, (before, peak)
    assert after - before < 32, (before, after)
    assert codes == [42209] * 192
    assert requests.get(f"{url}/schemas/types", timeout=10).json() == ["JSON", "PROTOBUF", "AVRO"]
