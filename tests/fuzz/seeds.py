"""Valid inputs for each fuzz target, built with the project's own writers, so that fuzzing
starts inside each format rather than at random bytes.

Deterministic (fixed timestamps, nonces and keys): ``corpus/<target>/seed-<label>`` holds each
one, and ``test_corpus_replay.py`` checks that they still match what the writers produce.
``python -m tests.fuzz TARGET`` writes any that are missing before it fuzzes.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Final

from tests.fuzz import targets

NOW_MS: Final = 1_700_000_000_000


def write_missing(target: str) -> int:
    """Write the target's seeds that its corpus lacks; return how many were written."""
    folder = targets.corpus_folder(target)
    folder.mkdir(parents=True, exist_ok=True)
    written = 0
    for label, data in BUILDERS[target]().items():
        path = folder / f"seed-{label}"
        if not path.exists():
            path.write_bytes(data)
            written += 1
    return written


# --- request frames ---------------------------------------------------------------------------


def request_frames() -> dict[str, bytes]:
    """A request of every API the broker serves, at its newest version and at its oldest when
    that one's header differs (not flexible), with values from a seeded sampler; a Produce
    carrying a real batch; an ApiVersions of a version the broker does not know."""
    from kio.index import load_request_schema

    from icefloe.broker.apis import SUPPORTED_APIS
    from tests.support.kafka_samples import sample_entity
    from tests.support.kafka_wire import encode_request, produce_request

    rng = random.Random(7)
    names = ("clicks", "fuzz-group", "fuzz-txn")
    frames = {}
    for api in SUPPORTED_APIS.values():
        newest = load_request_schema(api.key, api.max_version)
        versions = [api.max_version]
        oldest = load_request_schema(api.key, api.min_version)
        if oldest.__flexible__ != newest.__flexible__:
            versions.append(api.min_version)
        for version in versions:
            body = sample_entity(load_request_schema(api.key, version), rng, names=names)
            frames[f"{api.name}-v{version}"] = encode_request(body, 1, "fuzz")[4:]
    produce = produce_request("clicks", 0, _batches()["keys-values-headers"], version=11)
    frames["produce-v11-batch"] = encode_request(produce, 2, "fuzz")[4:]
    frames["api_versions-v99"] = b"\x00\x12\x00\x63\x00\x00\x00\x03\x00\x04fuzz"
    return frames


# --- record batches ---------------------------------------------------------------------------


def _batches() -> dict[str, bytes]:
    from icefloe.storage.batch import Compression
    from icefloe.storage.records import Record, build_batch

    plain = [
        Record(0, NOW_MS, b"user-1", b'{"page": "/home"}', (("trace", b"abc"), ("empty", None))),
        Record(1, NOW_MS + 5, None, b"no key"),
        Record(2, NOW_MS + 7, b"tombstone", None),
        Record(3, NOW_MS - 3, b"k" * 200, b"v" * 3000),
    ]
    batches = {"keys-values-headers": build_batch(plain)}
    for codec in (Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        batches[codec.name.lower()] = build_batch(plain, compression=codec)
    batches["idempotent"] = build_batch(
        plain[:2], producer_id=42, producer_epoch=3, base_sequence=17
    )
    batches["transactional"] = build_batch(
        plain[:1], producer_id=43, producer_epoch=0, base_sequence=0, is_transactional=True
    )
    batches["header-key-not-utf8"] = build_batch(
        [Record(0, NOW_MS, b"k", b"v", (("\udcff\udcfe", b"x"),))]
    )
    return batches


def record_batches() -> dict[str, bytes]:
    """Batches as producers send them: every codec, idempotent and transactional ones, odd
    headers; and two batches back to back (what the library API takes)."""
    batches = _batches()
    batches["two-batches"] = batches["keys-values-headers"] + batches["idempotent"]
    return batches


# --- WAL objects ------------------------------------------------------------------------------


def wal_objects() -> dict[str, bytes]:
    """Objects sealed by the WAL writer's encoder: one stream, several, compressed batches."""
    from icefloe.storage.walformat import ChunkInput, encode_wal_object

    batches = _batches()
    layouts = {
        "one-stream": [ChunkInput(1, [batches["keys-values-headers"]])],
        "three-streams": [
            ChunkInput(7, [batches["idempotent"], batches["transactional"]]),
            ChunkInput(2, [batches["zstd"]]),
            ChunkInput(2**40, [batches["header-key-not-utf8"]]),
        ],
        "compressed": [ChunkInput(3, [batches["gzip"], batches["lz4"], batches["snappy"]])],
    }
    return {
        label: encode_wal_object(chunks, created_ms=NOW_MS).data
        for label, chunks in layouts.items()
    }


# --- Parquet data files -----------------------------------------------------------------------


def parquet_files() -> dict[str, bytes]:
    """Data files as compaction writes them, with each codec a table may use."""
    from icefloe.storage.batch import read_header
    from icefloe.storage.parquet import RowBuilder, encode_data_file

    batches = _batches()
    files = {}
    for codec in ("zstd", "snappy", "none"):
        builder = RowBuilder(0)
        offset = 100
        for label in ("keys-values-headers", "idempotent", "transactional", "gzip"):
            builder.add_batch(batches[label], offset, committed=label == "transactional")
            offset += read_header(batches[label]).record_count
        data, _ = encode_data_file(builder.table(), 100, offset, codec)
        files[codec] = data
    return files


# --- SASL -------------------------------------------------------------------------------------


def sasl_messages() -> dict[str, bytes]:
    """Logins as clients send them: PLAIN right and wrong, SCRAM client-first and
    client-final messages (the final one's proof cannot match a server nonce chosen afresh,
    but it parses), OAUTHBEARER with a token that verifies."""
    from scramp import ScramClient  # type: ignore[import-untyped]

    mechanisms = {name: bytes([i]) for i, name in enumerate(targets.SASL_MECHANISMS)}
    sep = targets.SASL_SEPARATOR
    user, password = targets.SASL_USER, targets.SASL_PASSWORD
    seeds = {
        "plain": mechanisms["PLAIN"] + f"\0{user}\0{password}".encode(),
        "plain-authzid-wrong-password": mechanisms["PLAIN"] + f"{user}\0{user}\0nope".encode(),
    }
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        client = ScramClient([mechanism], user, password, c_nonce="fyko+d2lbbFgONRv9qkxdawL")
        first = client.get_client_first()
        server_nonce = "fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j"
        client.set_server_first(f"r={server_nonce},s=ZnV6ei1zYWx0LTAxMjM0NTY3ODk=,i=4096")
        final = client.get_client_final()
        seeds[mechanism.lower()] = mechanisms[mechanism] + first.encode() + sep + final.encode()
    token = _token({"sub": user, "exp": 4_102_444_800, "iat": 1_700_000_000})
    oauth = mechanisms["OAUTHBEARER"]
    seeds["oauthbearer"] = oauth + f"n,,\x01auth=Bearer {token}\x01\x01".encode()
    seeds["oauthbearer-authzid"] = oauth + f"n,a={user},\x01auth=Bearer {token}\x01\x01".encode()
    return seeds


def _token(claims: dict[str, object]) -> str:
    import jwt
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(targets.TOKEN_KEY_SEED)
    return jwt.encode(claims, key, algorithm="EdDSA", headers={"kid": "fuzz"})


# --- schema registry --------------------------------------------------------------------------


def registry_bodies() -> dict[str, bytes]:
    """A body for each request the target sends: schemas of the three languages (one with a
    reference), compatibility checks and look-ups, a configuration and a mode."""
    ops = {path: bytes([i]) for i, (_, path) in enumerate(targets.REGISTRY_REQUESTS)}
    register, compat_avro, compat_json, compat_proto, lookup_avro, lookup_proto, config, mode = (
        ops.values()
    )
    schemas = targets.SEED_SCHEMAS
    avro_v2 = json.loads(schemas["AVRO"])
    avro_v2["fields"].append({"name": "referrer", "type": ["null", "string"], "default": None})
    json_open = json.loads(schemas["JSON"])
    json_open.pop("additionalProperties")
    nested_proto = (
        'syntax = "proto3";\npackage fuzz.more;\nimport "click.proto";\n\n'
        "message Visit {\n  fuzz.Click click = 1;\n  repeated string tags = 2;\n"
        "  map<string, int64> counts = 3;\n  oneof who { string user = 4; int32 id = 5; }\n}\n"
    )

    def body(value: object) -> bytes:
        return json.dumps(value).encode()

    return {
        "register-avro": register + body({"schema": json.dumps(avro_v2)}),
        "register-json": register + body({"schema": json.dumps(json_open), "schemaType": "JSON"}),
        "register-protobuf-reference": register
        + body(
            {
                "schema": nested_proto,
                "schemaType": "PROTOBUF",
                "references": [
                    {"name": "click.proto", "subject": targets.SUBJECTS["PROTOBUF"], "version": 1}
                ],
            }
        ),
        "compatibility-avro": compat_avro + body({"schema": json.dumps(avro_v2)}),
        "compatibility-json": compat_json
        + body({"schema": json.dumps(json_open), "schemaType": "JSON"}),
        "compatibility-protobuf": compat_proto
        + body(
            {
                "schema": schemas["PROTOBUF"].replace("int64 ms", "int32 ms"),
                "schemaType": "PROTOBUF",
            }
        ),
        "lookup-avro": lookup_avro + body({"schema": schemas["AVRO"]}),
        "lookup-protobuf": lookup_proto
        + body({"schema": schemas["PROTOBUF"], "schemaType": "PROTOBUF"}),
        "config": config + body({"compatibility": "FULL_TRANSITIVE"}),
        "mode": mode + body({"mode": "READONLY"}),
    }


BUILDERS: Final[dict[str, Callable[[], dict[str, bytes]]]] = {
    "request_frame": request_frames,
    "record_batches": record_batches,
    "wal_object": wal_objects,
    "parquet_rebuild": parquet_files,
    "sasl_exchange": sasl_messages,
    "registry_body": registry_bodies,
}
"""Each target's seed builder, by target name."""
