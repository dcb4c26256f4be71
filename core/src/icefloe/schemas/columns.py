"""Typed columns of a schema-backed topic's data file, decoded from its raw key or value.

For each decoded side (``key``, ``value``) three columns join the Kafka columns, which stay
byte for byte as they are (Kafka catch-up reads are rebuilt from them):

- ``<side>_schema_id`` (int32): the schema id of the record's wire-format header, or null;
- ``<side>_error`` (string): why the record did not decode (its dead-letter reason), or null;
- ``<side>_fields`` (struct): the decoded value, null for a dead letter. Its type is the merge
  (:func:`.arrow_types.merge`) of the types of the versions of the topic's subject
  (``<topic>-<side>``, Confluent's default subject name), in version order; a version whose
  type conflicts with those before it gets no column (its records are dead letters). Records
  of a schema that is no version of the subject (another subject naming strategy) decode
  only where their type lies within that merge, and are dead letters otherwise. Versions are
  only ever added to a subject, so every task of every partition derives the same types, and
  the tables' columns never meet a file whose types conflict with theirs.

Resolving schemas is asynchronous (:func:`resolve`, once per distinct id); decoding is CPU
work (:func:`add_columns`, on a worker thread) done a slice of rows at a time, so the Python
values of at most :data:`SLICE_ROWS` records exist at once.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from icefloe.schemas import wire
from icefloe.schemas.arrow_types import Decoder, SchemaError, TypeConflict, merge
from icefloe.schemas.model import RegisteredSchema, SchemaLookup, SchemaReference, SchemaType
from icefloe.storage.row_schema import OFFSET, PARTITION, ROW_SCHEMA, TIMESTAMP

log = logging.getLogger(__name__)

SIDES: Final = ("key", "value")
SLICE_ROWS: Final = 4096
MAX_REFERENCES: Final = 64
"""Most schemas one schema may pull in through references (all levels together)."""
MAX_ERROR_CHARS: Final = 500
MAX_VERSIONS: Final = 1000
"""Versions of a subject read for its types."""
MISSES: Final = 4
"""Absent versions in a row that end a subject (versions deleted for good leave gaps)."""
CACHED_DECODERS: Final = 256
"""Decoders a process keeps between tasks, by schema (compiling a Protobuf schema runs
protoc)."""
_CACHE: collections.OrderedDict[tuple[int, str, tuple[str, ...]], Decoder | str] = (
    collections.OrderedDict()
)


def schema_id_column(side: str) -> str:
    return f"{side}_schema_id"


def error_column(side: str) -> str:
    return f"{side}_error"


def fields_column(side: str) -> str:
    return f"{side}_fields"


def fixed_fields(sides: Iterable[str]) -> list[pa.Field]:
    """The columns every data file of a topic decoding ``sides`` has (its table is created
    with them; ``<side>_fields`` joins the tables with the first file that has it)."""
    return [
        f
        for side in sides
        for f in (
            pa.field(schema_id_column(side), pa.int32()),
            pa.field(error_column(side), pa.string()),
        )
    ]


def dead_letter_schema(sides: Iterable[str]) -> pa.Schema:
    """The rows of a dead-letter table: where the record is, its raw bytes, and per decoded
    side its schema id and error."""
    kafka = [ROW_SCHEMA.field(name) for name in (PARTITION, OFFSET, TIMESTAMP, "key", "value")]
    return pa.schema([*kafka, *fixed_fields(sides)])


def dead_letter_rows(table: pa.Table, sides: Sequence[str]) -> pa.Table:
    """The rows of ``table`` (a data file's, with typed columns) that are dead letters."""
    dead = None
    for side in sides:
        failed = pc.is_valid(table.column(error_column(side)))
        dead = failed if dead is None else pc.or_(dead, failed)
    schema = dead_letter_schema(sides)
    rows = table.select(schema.names)
    return (rows.filter(dead) if dead is not None else rows.slice(0, 0)).cast(schema)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A schema id's schema with the texts it references, or why there is none."""

    schema: RegisteredSchema | None
    references: tuple[tuple[str, RegisteredSchema], ...] = ()
    """``(name, schema)`` of each referenced schema (a Protobuf import path, an Avro type's
    name), the ones others import first."""
    error: str | None = None


async def resolve(ids: Iterable[int], lookup: SchemaLookup) -> dict[int, Resolved]:
    """Each id's schema and its references (depth first, each once), from ``lookup``."""
    resolved: dict[int, Resolved] = {}
    for schema_id in sorted(set(ids)):
        schema = await lookup.by_id(schema_id)
        if schema is None:
            resolved[schema_id] = Resolved(None, error=f"unknown schema id {schema_id}")
            continue
        try:
            references = await _references(schema, lookup)
        except SchemaError as exc:
            resolved[schema_id] = Resolved(None, error=f"schema {schema_id}: {exc}")
            continue
        resolved[schema_id] = Resolved(schema, references)
    return resolved


async def _references(
    schema: RegisteredSchema, lookup: SchemaLookup
) -> tuple[tuple[str, RegisteredSchema], ...]:
    found: dict[str, RegisteredSchema] = {}
    pending = list(schema.references)
    seen = set()
    while pending:
        reference = pending.pop()
        if reference in seen:
            continue
        seen.add(reference)
        if len(seen) > MAX_REFERENCES:
            raise SchemaError(f"more than {MAX_REFERENCES} referenced schemas")
        target = await lookup.by_reference(reference)
        if target is None:
            raise SchemaError(
                f"references {reference.subject} version {reference.version}, which is unknown"
            )
        found.setdefault(reference.name, target)
        pending.extend(target.references)
    # Referenced schemas first, the deepest ones before those that import them.
    return tuple(reversed(list(found.items())))


def decoder_of(resolved: Resolved) -> Decoder:
    """A decoder for a resolved schema.

    Raises:
        SchemaError: the schema cannot become columns (or its language's library is missing).
    """
    schema = resolved.schema
    assert schema is not None
    try:
        if schema.schema_type is SchemaType.AVRO:
            from icefloe.schemas.decode_avro import AvroDecoder

            return AvroDecoder(schema.schema, [r.schema for _, r in resolved.references])
        if schema.schema_type is SchemaType.JSON:
            from icefloe.schemas.decode_json import JsonDecoder

            return JsonDecoder(schema.schema)
        from icefloe.schemas.decode_protobuf import ProtobufDecoder

        return ProtobufDecoder(schema.schema, resolved.references)
    except ImportError as exc:
        raise SchemaError(f"{schema.schema_type} decoding needs {exc.name}") from None
    except RecursionError:
        raise SchemaError("nested too deeply") from None


def _id_of(head: bytes | None) -> int | None:
    try:
        return wire.schema_id(head)
    except wire.WireError:
        return None


def schema_ids(values: Sequence[bytes | None]) -> list[int | None]:
    """Each value's schema id, ``None`` where it is not in the wire format."""
    ids: list[int | None] = []
    for value in values:
        try:
            ids.append(wire.schema_id(value))
        except wire.WireError:
            ids.append(None)
    return ids


def distinct_schema_ids(column: pa.ChunkedArray | pa.Array) -> set[int]:
    """The schema ids a raw key or value column's wire-format records carry, from the distinct
    5-byte heads of its values (a few, whatever the number of records)."""
    heads = pc.unique(pc.binary_slice(column, 0, wire.HEADER_BYTES)).to_pylist()
    return {i for i in schema_ids(heads) if i is not None}


def dead_letters(table: pa.Table, sides: Sequence[str]) -> int:
    """Rows of ``table`` that did not decode on one of ``sides``."""
    dead = None
    for side in sides:
        failed = pc.is_valid(table.column(error_column(side)))
        dead = failed if dead is None else pc.or_(dead, failed)
    return 0 if dead is None else int(pc.sum(dead).as_py() or 0)


def dead_letters_in_footer(metadata: pq.FileMetaData, sides: Sequence[str]) -> int:
    """The dead letters of a data file, from its footer: rows whose error column is set, by
    the row groups' null counts (a record that failed on both sides counts twice)."""
    dead = 0
    for i in range(metadata.num_columns):
        if metadata.schema.column(i).path not in {error_column(side) for side in sides}:
            continue
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            stats = group.column(i).statistics
            if stats is not None and stats.has_null_count:
                dead += group.num_rows - int(stats.null_count)
    return dead


def subject(topic: str, side: str) -> str:
    """The registry subject of a topic's keys or values (Confluent's TopicNameStrategy)."""
    return f"{topic}-{side}"


async def subject_ids(name: str, lookup: SchemaLookup) -> list[int]:
    """The schema ids of subject ``name``'s versions, oldest first (up to
    :data:`MAX_VERSIONS`; a version deleted for good is skipped, and
    :data:`MISSES` absent versions in a row end the list)."""
    ids: list[int] = []
    misses = 0
    for version in range(1, MAX_VERSIONS + 1):
        found = await lookup.by_reference(SchemaReference(name, name, version))
        if found is None:
            misses += 1
            if misses == MISSES:
                break
            continue
        misses = 0
        if found.id not in ids:
            ids.append(found.id)
    return ids


def add_columns(
    table: pa.Table,
    sides: Sequence[str],
    resolved: Mapping[int, Resolved],
    versions: Mapping[str, Sequence[int]] | None = None,
) -> tuple[pa.Table, int]:
    """``table`` with the typed columns of ``sides``, and how many records did not decode on
    some side (the dead letters). ``versions``: each side's subject's schema ids, oldest first
    (:func:`subject_ids`), which come first in the merged type."""
    dead = [False] * table.num_rows
    for side in sides:
        table = _add_side(table, side, resolved, (versions or {}).get(side, ()), dead)
    return table, sum(dead)


def _add_side(
    table: pa.Table,
    side: str,
    resolved: Mapping[int, Resolved],
    versions: Sequence[int],
    dead: list[bool],
) -> pa.Table:
    column = table.column(side)
    ids = [_id_of(head) for head in pc.binary_slice(column, 0, wire.HEADER_BYTES).to_pylist()]
    used = {i for i in ids if i is not None}
    decoders, unusable = _decoders(used | set(versions), resolved)
    merged = _merged(decoders, unusable, [i for i in versions if i in decoders])
    for schema_id in sorted(set(decoders) - set(versions)):
        # Only the subject's versions shape the column: another schema widening it here
        # would give this file types that another file's schemas may contradict.
        reason = _outsider(schema_id, decoders[schema_id].arrow_type, merged, side)
        if reason is not None:
            unusable[schema_id] = reason
            del decoders[schema_id]
    for schema_id in set(versions) - used:  # only there for their types
        decoders.pop(schema_id, None)
        unusable.pop(schema_id, None)
    ids_out: list[int | None] = []
    errors: list[str | None] = []
    chunks: list[pa.Array] = []
    for start in range(0, table.num_rows, SLICE_ROWS):
        # A slice's Python bytes at a time, as for the decoded values.
        raw = column.slice(start, SLICE_ROWS).to_pylist()
        values: list[Any] = []
        for offset, value_bytes in enumerate(raw):
            row = start + offset
            value, error = _decode(value_bytes, ids[row], decoders, unusable)
            values.append(value)
            ids_out.append(ids[row])
            errors.append(error)
        if merged is not None:
            chunks.append(_array(values, merged, errors, start))
    for row, error in enumerate(errors):
        dead[row] = dead[row] or error is not None
    table = table.append_column(
        pa.field(schema_id_column(side), pa.int32()), pa.array(ids_out, pa.int32())
    )
    table = table.append_column(
        pa.field(error_column(side), pa.string()), pa.array(errors, pa.string())
    )
    if merged is not None:
        typed = pa.chunked_array(chunks, type=merged) if chunks else pa.chunked_array([], merged)
        table = table.append_column(pa.field(fields_column(side), merged), typed)
    return table


def _decoders(
    ids: set[int], resolved: Mapping[int, Resolved]
) -> tuple[dict[int, Decoder], dict[int, str]]:
    decoders: dict[int, Decoder] = {}
    unusable: dict[int, str] = {}
    for schema_id in sorted(ids):
        found = resolved.get(schema_id)
        if found is None or found.schema is None:
            unusable[schema_id] = (
                found.error if found and found.error else f"unknown schema id {schema_id}"
            )
            continue
        # By text too, not id only: ids are another registry's after a configuration change.
        key = (schema_id, found.schema.schema, tuple(r.schema for _, r in found.references))
        cached = _CACHE.get(key)
        if cached is None:
            try:
                cached = decoder_of(found)
            except Exception as exc:  # noqa: BLE001 - any fault of an untrusted schema
                cached = _clip(f"schema {schema_id} cannot become columns: {exc}")
            _CACHE[key] = cached
            if len(_CACHE) > CACHED_DECODERS:
                _CACHE.popitem(last=False)
        else:
            _CACHE.move_to_end(key)
        if isinstance(cached, str):
            unusable[schema_id] = cached
        else:
            decoders[schema_id] = cached
    return decoders, unusable


def _merged(
    decoders: dict[int, Decoder], unusable: dict[int, str], order: Sequence[int]
) -> pa.StructType | None:
    """The merged type of the usable schemas, in ``order``; a schema whose type conflicts
    with those before it becomes unusable (its records are dead letters)."""
    merged: pa.DataType | None = None
    for schema_id in order:
        own = decoders[schema_id].arrow_type
        try:
            merged = own if merged is None else merge(merged, own)
        except TypeConflict as exc:
            unusable[schema_id] = _clip(f"schema {schema_id} does not fit the column: {exc}")
    for schema_id in unusable:
        decoders.pop(schema_id, None)
    return merged if merged is None or pa.types.is_struct(merged) else None


def _outsider(
    schema_id: int, own: pa.DataType, merged: pa.DataType | None, side: str
) -> str | None:
    """Why records of a schema that is no version of the topic's subject cannot fill the
    column (``None``: its type lies within the column's)."""
    try:
        fits = merged is not None and merge(merged, own) == merged
    except TypeConflict:
        fits = False
    if fits:
        return None
    return (
        f"schema {schema_id} is no version of the topic's {side} subject (<topic>-{side}) and "
        "does not fit the columns its versions give: register the schema under that subject"
    )


def _decode(
    raw: bytes | None,
    schema_id: int | None,
    decoders: Mapping[int, Decoder],
    unusable: Mapping[int, str],
) -> tuple[Any, str | None]:
    """(decoded value, None), or (None, dead-letter reason)."""
    if raw is None:
        return None, None  # a tombstone or a null key is no dead letter: there is nothing to decode
    if schema_id is None:
        try:
            wire.schema_id(raw)
        except wire.WireError as exc:
            return None, _clip(f"not in the wire format: {exc}")
    assert schema_id is not None
    if schema_id in unusable:
        return None, unusable[schema_id]
    try:
        return decoders[schema_id].decode(wire.payload(raw)), None
    except Exception as exc:  # noqa: BLE001 - untrusted bytes: a dead letter, never a failed task
        return None, _clip(f"schema {schema_id}: {exc or type(exc).__name__}")


def _array(
    values: list[Any], arrow_type: pa.DataType, errors: list[str | None], start: int
) -> pa.Array:
    """The values as one array; a value pyarrow refuses (it does not fit the merged type) is
    a dead letter, found by building the slice's values one at a time."""
    try:
        return pa.array(values, type=arrow_type)
    except Exception:  # noqa: BLE001 - found record by record below
        pass
    kept = []
    for i, value in enumerate(values):
        try:
            pa.array([value], type=arrow_type)
        except Exception as exc:  # noqa: BLE001 - the value goes, the task carries on
            errors[start + i] = _clip(f"the value does not fit the column type: {exc}")
            value = None
        kept.append(value)
    return pa.array(kept, type=arrow_type)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"
