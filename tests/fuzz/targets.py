"""The fuzz targets: each feeds bytes to one parser of untrusted input as production code does.

A target returns normally when the parser accepts the input or refuses it with its documented
refusal (a :class:`~icefloe.errors.KafkaError` with its code, the module's own parse error, a
Confluent error body); anything else it raises, a hang or a huge allocation is a finding.
Where what a parser accepts is read again later (a batch stored on produce, decoded by
compaction), the target runs that reader too: an input one accepts and the next one chokes on
is a poison pill. Nothing here imports atheris: ``test_corpus_replay.py`` replays the corpus
through these functions in the suite.

Checksums are not a defence against a hostile client or a hostile object writer, who computes
them, so targets whose format carries CRC-32Cs run an input twice: as it is, and with its
checksums made to match (mutations would otherwise almost never get past them).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

T = TypeVar("T")

SCRATCH_ENV: Final = "ICEFLOE_FUZZ_SCRATCH"
"""A folder for the targets' stores (the fuzzing runner sets it and removes it after)."""
PARTITION: Final = "fuzz-0"
"""The ``topic-N`` a compacted topic's key check names."""
MAX_BATCH_BYTES: Final = 1 << 20
"""Kafka's default ``max.message.bytes``, as the produce path gets it from the topic."""
MAX_WAL_CHUNKS: Final = 64
"""Chunks of a WAL object read as the index would point at them: enough to reach every
layout, few enough that one input stays fast."""
DATA_FILE: Final = "tables/fuzz/data/0.parquet"
MAX_ROW_GROUPS: Final = 16
MAX_SASL_MESSAGES: Final = 3
SASL_SEPARATOR: Final = b"\xff"
"""Splits a SASL input into the client's messages: 0xff is never in UTF-8, so no real
message holds it."""


CORPUS: Final = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]


def corpus_folder(target: str) -> Path:
    """The folder of a target's inputs: ``corpus/<target>/``."""
    return CORPUS / target


class Finding(AssertionError):
    """A target's own check failed: the input is not refused, and not handled right either."""


# --- 1. Kafka request frames -----------------------------------------------------------------


def request_frame(data: bytes) -> None:
    """A request frame (without its size prefix) as the broker's connection loop handles it:
    the API and version looked up, ApiVersions of an unknown version answered, anything else
    decoded after its bounds check. Refusal: ``ProtocolError`` (the connection is closed).

    kio's native decoder aborts the process on a length it cannot allocate, so the finding
    that matters most here is a crash the bounds check should have prevented.
    """
    from icefloe.broker import protocol
    from icefloe.broker.apis import SUPPORTED_APIS
    from icefloe.broker.handlers.api_versions import unsupported_version_response

    frame = memoryview(data).toreadonly()
    try:
        api_key, api_version = protocol.peek_api(frame)
    except protocol.ProtocolError:
        return
    api = SUPPORTED_APIS.get(api_key)
    if api is None:
        return  # ProtocolError: unsupported API key
    if not api.supports(api_version):
        if api_key == protocol.API_VERSIONS_KEY:
            unsupported_version_response(frame)
        return
    with contextlib.suppress(protocol.ProtocolError):
        protocol.decode_request(frame)


# --- 2. record batches on the produce path ---------------------------------------------------


def record_batches(data: bytes) -> None:
    """One partition's ``records`` of a Produce request through what the broker runs on it,
    then through what reads the stored batches back.

    Produce: :func:`~icefloe.storage.batch.split_and_validate`, the key check of a compacted
    topic, recompression for a topic whose ``compression.type`` differs, log-append-time
    stamping. Then, for the batches it accepted: a fetch's base-offset patching, compaction's
    decoding into table rows (:class:`~icefloe.storage.parquet.RowBuilder`), which must agree
    with the record-by-record decoder, and the rebuild of batches from those rows for a
    catch-up read. Refusal: ``BatchError`` (a ``KafkaError``) on produce; compaction must
    refuse a stored batch when the record decoder does, and only then.
    """
    for records in _unique(data, with_valid_batch_crcs(data)):
        _produce_and_read_back(records)


def _produce_and_read_back(records: bytes) -> None:
    from icefloe.storage import keyed
    from icefloe.storage.batch import (
        BatchError,
        Compression,
        patch_base_offsets,
        split_and_validate,
        with_log_append_time,
    )
    from icefloe.storage.records import decode_batch, recompress

    try:
        infos = split_and_validate(records, max_batch_bytes=MAX_BATCH_BYTES)
    except BatchError:
        return
    chunks = [records[i.position : i.position + i.size] for i in infos]
    with contextlib.suppress(BatchError):
        keyed.check_keys(chunks, PARTITION)
    for chunk, info in zip(chunks, infos, strict=True):
        other = Compression.ZSTD if info.compression is Compression.NONE else Compression.NONE
        with contextlib.suppress(BatchError):  # the Kafka error the broker answers
            recompress(chunk, other)
        with_log_append_time(chunk, 1_700_000_000_000)
    # Stored as received; read back from offset 1000 on.
    stored = b"".join(chunks)
    patch_base_offsets(stored, 1000, partition_leader_epoch=3)
    decoded = []
    for chunk in chunks:
        try:
            decoded.append(decode_batch(chunk)[1])
        except BatchError:
            decoded.append(None)
    _check_compaction_agrees(chunks, decoded)


def _check_compaction_agrees(chunks: list[bytes], decoded: list[Any]) -> None:
    """Compaction turns each batch into rows: it must refuse what the record decoder refuses,
    take what it takes, and find the same records; the rows must rebuild into valid batches."""
    from icefloe.storage.batch import BatchError
    from icefloe.storage.parquet import RowBuilder
    from icefloe.storage.rebuild import rebuild_batches

    for chunk, records in zip(chunks, decoded, strict=True):
        builder = RowBuilder(0)
        try:
            builder.add_batch(chunk, 1000)
            table = builder.table()
        except BatchError as exc:
            if records is not None:
                raise Finding(f"compaction refuses a batch the decoder reads: {exc}") from exc
            continue
        if records is None:
            raise Finding("compaction takes a batch the record decoder refuses")
        # Timestamps are left out: far from the epoch they do not convert to Python's.
        rows = table.select(["offset", "key", "value", "headers"]).to_pylist()
        if len(rows) != len(records):
            raise Finding(f"compaction finds {len(rows)} records, the decoder {len(records)}")
        offsets = _table_offsets(chunk, records)
        for row, record, offset in zip(rows, records, offsets, strict=True):
            seen = (row["offset"], row["key"], row["value"], _header_pairs(row["headers"]))
            expected = (offset, record.key, record.value, _valid(record.headers))
            if seen != expected:
                raise Finding(f"compaction reads {seen!r}, the decoder {expected!r}")
        _check_rebuilt(rebuild_batches(table))


def _table_offsets(batch: bytes, records: list[Any]) -> list[int]:
    """The offsets a table keeps for a batch's records read from offset 1000 on: as written
    where they increase within the batch's offsets, else by position (a hostile producer's
    deltas; see ``icefloe.storage.parquet``)."""
    from icefloe.storage.batch import read_header

    last = read_header(batch).last_offset_delta
    deltas = [record.offset for record in records]
    if all(0 <= d <= last for d in deltas) and all(a < b for a, b in itertools.pairwise(deltas)):
        return [1000 + d for d in deltas]
    return [1000 + i for i in range(len(records))]


def _header_pairs(headers: list[dict[str, Any]]) -> tuple[tuple[str, bytes | None], ...]:
    return tuple((h["key"], h["value"]) for h in headers)


def _valid(headers: tuple[tuple[str, bytes | None], ...]) -> tuple[tuple[str, bytes | None], ...]:
    """Header keys as a table stores them: bytes that are not UTF-8 replaced by U+FFFD."""
    return tuple(
        (key.encode("utf-8", "surrogateescape").decode("utf-8", "replace"), value)
        for key, value in headers
    )


def _check_rebuilt(batches: bytes) -> None:
    """Batches rebuilt for a catch-up read are whole v2 batches with valid CRCs."""
    from icefloe.errors import CorruptDataError
    from icefloe.storage.walformat import verify_chunk

    if not batches:
        return
    try:
        verify_chunk(batches)
    except CorruptDataError as exc:
        raise Finding(f"rows rebuild into batches a consumer would refuse: {exc}") from exc


# --- 3. WAL objects read back from the object store ------------------------------------------


def wal_object(data: bytes) -> None:
    """A WAL object as its readers meet it.

    Whole: :func:`~icefloe.storage.walformat.decode_wal_object`, then each chunk checked
    (:func:`~icefloe.storage.walformat.verify_chunk`). Chunk by chunk, as the offset index
    points at them (here: where the object's own table says, as the writer indexed it) and a
    ranged read returns them, unprotected by the object's trailer: a fetch's base-offset
    patching and decoding, and compaction's decoding into rows. Refusal: ``CorruptDataError``
    (``BatchError`` is one).
    """
    for obj in _unique(data, with_valid_trailer(data)):
        _decode_whole(obj)
    for entry, chunk in _listed_chunks(data):
        for variant in _unique(chunk, with_valid_batch_crcs(chunk)):
            _read_chunk(entry, variant)


def _decode_whole(obj: bytes) -> None:
    from icefloe.errors import CorruptDataError
    from icefloe.storage.walformat import decode_wal_object, verify_chunk

    try:
        decoded = decode_wal_object(obj)
        for entry in decoded.chunks:
            verify_chunk(decoded.chunk(entry))
    except CorruptDataError:
        pass


def _listed_chunks(data: bytes) -> Iterator[tuple[Any, bytes]]:
    """The chunks the object's table lists, each as a ranged read of it returns its bytes
    (fewer at the end of the object)."""
    from icefloe.storage.walformat import CHUNK_ENTRY_SIZE, HEADER_SIZE_V1, ChunkEntry

    if len(data) < HEADER_SIZE_V1:
        return
    (count,) = struct.unpack_from(">I", data, 20)
    count = min(count, MAX_WAL_CHUNKS, (len(data) - HEADER_SIZE_V1) // CHUNK_ENTRY_SIZE)
    for i in range(count):
        at = HEADER_SIZE_V1 + i * CHUNK_ENTRY_SIZE
        entry = ChunkEntry._make(struct.unpack_from(">QQIIIqq", data, at))
        chunk = data[entry.position : entry.position + entry.length]
        if chunk:
            yield entry, chunk


def _read_chunk(entry: Any, chunk: bytes) -> None:
    from icefloe.compaction.task import _decode_chunks
    from icefloe.errors import CorruptDataError
    from icefloe.ports.compaction import StreamRange
    from icefloe.storage.batch import patch_base_offsets
    from icefloe.storage.records import decode_batch
    from icefloe.storage.walformat import verify_chunk

    first = 5000
    try:
        patched = patch_base_offsets(chunk, first, partition_leader_epoch=1)
        for batch in verify_chunk(patched):  # a timestamp look-up decodes them
            decode_batch(patched[batch.position : batch.position + batch.length])
    except CorruptDataError:
        pass
    # The offset index says which offsets the chunk holds: the table's count, as the writer
    # indexed it.
    listed = StreamRange(
        entry.stream_id, 0, first, first + entry.record_count, "wal", 0, len(chunk)
    )
    with contextlib.suppress(CorruptDataError):
        _decode_chunks(entry.stream_id, [(listed, memoryview(chunk))])


# --- 4. Parquet data files rebuilt into batches ----------------------------------------------


def parquet_rebuild(data: bytes) -> None:
    """A data file's bytes as a catch-up read meets them: its footer and row groups fetched
    through :class:`~icefloe.storage.parquet_reader.ParquetRangeReader` from an object store,
    decoded, and rebuilt into Kafka batches
    (:func:`~icefloe.storage.rebuild.rebuild_groups`), which must be whole batches with valid
    CRCs. Refusal: ``CorruptDataError``, as the reader raises it.
    """
    from icefloe.errors import CorruptDataError

    with contextlib.suppress(CorruptDataError):
        _run(_read_data_file(data))


async def _read_data_file(data: bytes) -> None:
    import pyarrow as pa

    from icefloe.errors import CorruptDataError
    from icefloe.storage.parquet_reader import ParquetRangeReader
    from icefloe.storage.rebuild import rebuild_groups

    store = await _object_store()
    await store.put(DATA_FILE, data)
    reader = ParquetRangeReader(store)
    # As StreamReader._from_row_groups reads the row groups an index entry names.
    try:
        metadata = await reader.metadata(DATA_FILE, len(data))
        groups = list(range(min(metadata.num_row_groups, MAX_ROW_GROUPS)))
        fetched = await reader.fetch(DATA_FILE, len(data), groups)
        group_rows = [fetched.metadata.row_group(g).num_rows for g in groups]
        rebuilt = rebuild_groups(fetched.decode(), group_rows, end_offset=None)
    except (pa.ArrowException, OSError, ValueError, LookupError, TypeError) as exc:
        raise CorruptDataError(f"data file does not decode: {exc}") from exc
    for group in rebuilt:
        _check_rebuilt(bytes(group.data))


# --- 5. SASL exchanges -----------------------------------------------------------------------

SASL_MECHANISMS: Final = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SASL_USER: Final = "ann"
SASL_PASSWORD: Final = "s3cret"
TOKEN_KEY_SEED: Final = bytes(range(32))
"""The Ed25519 key that signs the seed tokens: fixed, so that they verify in every run."""


def sasl_exchange(data: bytes) -> None:
    """A SASL login as SaslHandshake and SaslAuthenticate requests carry it: the first byte
    picks the mechanism (:data:`SASL_MECHANISMS`), the rest is the client's messages split by
    :data:`SASL_SEPARATOR`, each handed to :meth:`~icefloe.security.sasl.SaslExchange.step`
    until one is refused or the exchange is done. The user ``ann`` exists (password
    ``s3cret``), and OAUTHBEARER tokens are checked against a key set. Refusal:
    ``AuthenticationFailed``.
    """
    if not data:
        return
    mechanism = SASL_MECHANISMS[data[0] % len(SASL_MECHANISMS)]
    messages = data[1:].split(SASL_SEPARATOR)[:MAX_SASL_MESSAGES]
    _run(_login(mechanism, messages))


async def _login(mechanism: str, messages: list[bytes]) -> None:
    from icefloe.security.sasl import AuthenticationFailed, SaslExchange

    users, tokens = await _sasl_state()
    exchange = SaslExchange(mechanism, users, tokens)
    for message in messages:
        try:
            await exchange.step(message)
        except AuthenticationFailed:
            return
        if exchange.done:
            if exchange.principal is None:
                raise Finding("the exchange is done without a user and without a refusal")
            return


# --- 6. schema registry request bodies -------------------------------------------------------

SUBJECTS: Final = {"AVRO": "avro-value", "JSON": "json-value", "PROTOBUF": "proto-value"}
"""Subjects holding one schema each, to check compatibility against and to reference."""
SCRATCH_SUBJECT: Final = "fuzz-value"
"""Where a fuzzed schema is registered and a configuration set; emptied after each input."""
REGISTRY_REQUESTS: Final = (
    ("POST", f"/subjects/{SCRATCH_SUBJECT}/versions"),
    ("POST", f"/compatibility/subjects/{SUBJECTS['AVRO']}/versions/latest?verbose=true"),
    ("POST", f"/compatibility/subjects/{SUBJECTS['JSON']}/versions?verbose=true"),
    ("POST", f"/compatibility/subjects/{SUBJECTS['PROTOBUF']}/versions/1?verbose=true"),
    ("POST", f"/subjects/{SUBJECTS['AVRO']}"),
    ("POST", f"/subjects/{SUBJECTS['PROTOBUF']}?format=serialized"),
    ("PUT", f"/config/{SCRATCH_SUBJECT}"),
    ("PUT", f"/mode/{SCRATCH_SUBJECT}"),
)
"""What the first byte of a registry input picks: the request its body is sent with."""


def registry_body(data: bytes) -> None:
    """A request body sent to the schema registry's HTTP API over a socket: the first byte
    picks the request (:data:`REGISTRY_REQUESTS`: register, compatibility checks, look-ups,
    configuration and mode), the rest is the body. Refusal: a Confluent error body with a 4xx
    status; a 5xx (the API's answer to a failure it did not expect) is a finding, raised with
    the traceback the API logged.
    """
    if not data:
        return
    method, path = REGISTRY_REQUESTS[data[0] % len(REGISTRY_REQUESTS)]
    _run(_send(method, path, data[1:]))


async def _send(method: str, path: str, body: bytes) -> None:
    client, failures = await _registry_state()
    failures.clear()
    try:
        async with client.request(method, path, data=body) as response:
            status = response.status
            answer = await response.read()
    finally:
        for cleanup in (f"/subjects/{SCRATCH_SUBJECT}", f"/config/{SCRATCH_SUBJECT}"):
            async with client.request("DELETE", cleanup):
                pass
        async with client.request("DELETE", f"/subjects/{SCRATCH_SUBJECT}?permanent=true"):
            pass
        async with client.request("DELETE", f"/mode/{SCRATCH_SUBJECT}"):
            pass
    if status >= 500:
        cause = failures[0] if failures else None
        raise Finding(f"{method} {path} answered {status}: {answer[:300]!r}") from cause


# --- the runtime the asynchronous targets share ----------------------------------------------


class _Runtime:
    """One event loop, and the stores and servers the targets open on it, kept from input to
    input (opening them per input would be most of the work)."""

    def __init__(self) -> None:
        self.runner: asyncio.Runner | None = None
        self.opened: dict[str, Any] = {}
        self.closers: list[Callable[[], Awaitable[None]]] = []
        self.scratch: Path | None = None
        self.owns_scratch = False

    def loop_runner(self) -> asyncio.Runner:
        if self.runner is None:
            self.runner = asyncio.Runner()
        return self.runner

    def folder(self, name: str) -> Path:
        if self.scratch is None:
            given = os.environ.get(SCRATCH_ENV)
            if given:  # one folder per process: libFuzzer starts processes of its own
                self.scratch = Path(given) / str(os.getpid())
            else:
                shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
                self.scratch = Path(tempfile.mkdtemp(prefix="icefloe-fuzz-", dir=shm))
                self.owns_scratch = True
        path = self.scratch / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def close(self) -> None:
        if self.runner is not None:
            for closer in reversed(self.closers):
                with contextlib.suppress(Exception):
                    self.runner.run(closer())
            self.runner.close()
        if self.owns_scratch and self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.__init__()  # type: ignore[misc]


_RUNTIME = _Runtime()


def close() -> None:
    """Close the stores and servers the targets opened, and remove their files (call it
    before the interpreter exits: thread pools refuse work by then)."""
    _RUNTIME.close()


def _run(work: Awaitable[T]) -> T:
    async def wrapped() -> T:
        return await work

    return _RUNTIME.loop_runner().run(wrapped())


async def _once(name: str, open_it: Callable[[], Awaitable[T]]) -> T:
    if name not in _RUNTIME.opened:
        _RUNTIME.opened[name] = await open_it()
    result: T = _RUNTIME.opened[name]
    return result


async def _metadata(name: str) -> Any:
    from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
    from icefloe.ports.base import OpenContext

    async def open_it() -> Any:
        store = await SqliteMetadataStore.open(
            SqliteMetadataStore.options_model(), OpenContext(data_dir=_RUNTIME.folder(name))
        )
        _RUNTIME.closers.append(store.close)
        return store

    return await _once(f"metadata {name}", open_it)


async def _object_store() -> Any:
    from icefloe.embedded.local_object_store import LocalObjectStore
    from icefloe.ports.base import OpenContext

    async def open_it() -> Any:
        options = LocalObjectStore.options_model(io_threads=1)
        store = await LocalObjectStore.open(options, OpenContext(data_dir=_RUNTIME.folder("store")))
        _RUNTIME.closers.append(store.close)
        return store

    return await _once("objects", open_it)


async def _sasl_state() -> tuple[Any, Any]:
    async def open_it() -> tuple[Any, Any]:
        from icefloe.config.security import OAuthBearerOptions
        from icefloe.security.oauthbearer import TokenValidator
        from icefloe.security.users import ScramCredential, UserStore

        users = UserStore(await _metadata("sasl"))
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            credential = ScramCredential.from_password(
                mechanism, SASL_PASSWORD, 4096, salt=b"fuzz-salt-0123456789"
            )
            await users.put(SASL_USER, credential)
        key_set = _RUNTIME.folder("sasl") / "jwks.json"
        key_set.write_text(token_key_set())
        return users, TokenValidator(OAuthBearerOptions(jwks_file=key_set))

    result: tuple[Any, Any] = await _once("sasl", open_it)
    return result


def token_key_set() -> str:
    """The JSON Web Key Set of :data:`TOKEN_KEY_SEED`'s public key."""
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = Ed25519PrivateKey.from_private_bytes(TOKEN_KEY_SEED).public_key()
    x = base64.urlsafe_b64encode(public.public_bytes(Encoding.Raw, PublicFormat.Raw))
    key = {"kty": "OKP", "crv": "Ed25519", "kid": "fuzz", "alg": "EdDSA", "x": x.rstrip(b"=")}
    return json.dumps({"keys": [{**key, "x": key["x"].decode()}]})  # type: ignore[union-attr]


class _Failures(logging.Handler):
    """Keeps the exceptions the registry's API logged, to raise them as the finding's cause."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.found.append(record.exc_info[1])


async def _registry_state() -> tuple[Any, list[BaseException]]:
    async def open_it() -> tuple[Any, list[BaseException]]:
        from aiohttp.test_utils import TestClient, TestServer

        from icefloe.schemas.http import RegistryApi

        failures = _Failures()
        logger = logging.getLogger("icefloe.schemas.http")
        logger.addHandler(failures)
        client: Any = TestClient(TestServer(RegistryApi(await _metadata("registry")).app()))
        await client.start_server()
        _RUNTIME.closers.append(client.close)
        for schema_type, subject in SUBJECTS.items():
            body = {"schema": SEED_SCHEMAS[schema_type], "schemaType": schema_type}
            async with client.post(f"/subjects/{subject}/versions", json=body) as response:
                if response.status != 200:
                    raise RuntimeError(f"seed schema of {subject}: {await response.text()}")
        return client, failures.found

    result: tuple[Any, list[BaseException]] = await _once("registry", open_it)
    return result


SEED_SCHEMAS: Final = {
    "AVRO": (
        '{"type": "record", "name": "Click", "namespace": "fuzz", "fields": ['
        '{"name": "page", "type": "string"}, {"name": "ms", "type": "long", "default": 0}]}'
    ),
    "JSON": (
        '{"type": "object", "properties": {"page": {"type": "string"}, '
        '"ms": {"type": "integer"}}, "required": ["page"], "additionalProperties": false}'
    ),
    "PROTOBUF": (
        'syntax = "proto3";\npackage fuzz;\n\n'
        "message Click {\n  string page = 1;\n  int64 ms = 2;\n}\n"
    ),
}
"""The schemas :data:`SUBJECTS` hold."""


# --- checksums made to match -----------------------------------------------------------------


def with_valid_batch_crcs(data: bytes) -> bytes:
    """``data`` read as v2 record batches back to back, each batch's CRC-32C recomputed over
    its bytes (up to the end of ``data`` where its length reaches past it)."""
    from icefloe.storage.batch import ATTRIBUTES_AT, CRC_AT, HEADER_SIZE, LOG_OVERHEAD
    from icefloe.storage.crc import crc32c

    out = bytearray(data)
    position = 0
    while len(out) - position >= HEADER_SIZE:
        (length,) = struct.unpack_from(">i", out, position + 8)
        end = min(len(out), position + LOG_OVERHEAD + max(length, 0))
        if end < position + HEADER_SIZE:
            break
        checksum = crc32c(memoryview(out)[position + ATTRIBUTES_AT : end])
        struct.pack_into(">I", out, position + CRC_AT, checksum)
        position = end
    return bytes(out)


def with_valid_trailer(data: bytes) -> bytes:
    """``data`` as a WAL object whose trailer CRC-32C matches the bytes before it."""
    from icefloe.storage.crc import crc32c

    if len(data) < 4:
        return data
    return data[:-4] + struct.pack(">I", crc32c(data[:-4]))


def _unique(*variants: bytes) -> list[bytes]:
    return list(dict.fromkeys(variants))


TARGETS: Final = {
    target.name: target
    for target in (
        Target("request_frame", request_frame),
        Target("record_batches", record_batches),
        Target("wal_object", wal_object),
        Target("parquet_rebuild", parquet_rebuild),
        Target("sasl_exchange", sasl_exchange),
        Target("registry_body", registry_body),
    )
}
"""Every target by name (the name of its corpus folder)."""
