"""Protobuf schemas: ``.proto`` text compiled by protoc (``grpcio-tools``) into descriptors, or
a base64 ``FileDescriptorProto`` as Confluent's clients register it; compared by the rules
Confluent documents for the common changes (docs/schema-registry.md lists them).

protoc runs in a child process with a time limit, so that hostile schema text cannot stall or
crash a broker. A schema's references are the files it imports, each under its import path.

For decoders, :func:`file_descriptor` turns a registered schema and its references (found
through a :class:`~icefloe.schemas.model.SchemaLookup`) into a ``google.protobuf``
``FileDescriptor``; :func:`message_class` gives the message class of Confluent's message
indexes in it.
"""

from __future__ import annotations

import base64
import binascii
import importlib.resources
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Final

from icefloe.schemas.formats import InvalidSchema, ParsedSchema, Referenced
from icefloe.schemas.model import RegisteredSchema, SchemaLookup, SchemaType

PROTOC_TIMEOUT_S: Final = 30.0
MAIN_FILE: Final = "schema.proto"
"""The file name a schema given as text compiles under (its references keep theirs)."""
_WELL_KNOWN: Final = (
    "any",
    "source_context",
    "type",
    "api",
    "descriptor",
    "duration",
    "empty",
    "field_mask",
    "struct",
    "timestamp",
    "wrappers",
)


def _pb() -> Any:
    try:
        from google.protobuf import descriptor_pb2  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        raise InvalidSchema(
            "Protobuf schemas need the protobuf package: pip install 'icefloe[schemas]'"
        ) from None
    return descriptor_pb2


def decode_serialized(text: str) -> Any | None:
    """The ``FileDescriptorProto`` a base64 schema holds, or ``None`` if ``text`` is not one."""
    if not text or any(c.isspace() or c in "{};" for c in text[:4096]):
        return None
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    proto = _pb().FileDescriptorProto()
    try:
        proto.ParseFromString(raw)
    except Exception:  # noqa: BLE001 - any decoding failure means "not a descriptor"
        return None
    return proto


def _flatten(references: Sequence[Referenced]) -> dict[str, RegisteredSchema]:
    """Every schema referenced, directly or not, by import path (first one wins)."""
    found: dict[str, RegisteredSchema] = {}
    for reference in references:
        found.update({k: v for k, v in _flatten(reference.references).items() if k not in found})
        found.setdefault(reference.name, reference.schema)
    return found


def compile_set(text: str, references: Sequence[Referenced] = ()) -> tuple[Any, str]:
    """The ``FileDescriptorSet`` of a schema and everything it imports, and the name of the
    schema's own file in it.

    Raises:
        InvalidSchema: the text or a reference does not compile.
    """
    pb = _pb()
    imported = _flatten(references)
    texts: dict[str, str] = {}
    serialized: list[Any] = []
    for name, schema in imported.items():
        if schema.schema_type is not SchemaType.PROTOBUF:
            raise InvalidSchema(f"reference {name!r} is not a Protobuf schema")
        proto = decode_serialized(schema.schema)
        if proto is None:
            texts[name] = schema.schema
        else:
            proto.name = name
            serialized.append(proto)
    main = decode_serialized(text)
    if main is not None:
        if not main.name:
            main.name = MAIN_FILE
        serialized.append(main)
        files = pb.FileDescriptorSet()
        if texts:
            files.MergeFrom(_protoc(texts, [], sorted(texts)))
        files.file.extend(serialized)
        _check_links(files)
        return files, main.name
    name = MAIN_FILE if MAIN_FILE not in imported else "icefloe-schema.proto"
    texts[name] = text
    return _protoc(texts, serialized, [name]), name


def _check_links(files: Any) -> None:
    """Build the files into a pool, as a decoder will: refuses broken descriptors."""
    from google.protobuf import descriptor_pool  # type: ignore[import-untyped, unused-ignore]

    pool = descriptor_pool.DescriptorPool()
    _add_well_known(pool)
    for proto in files.file:
        if proto.name.startswith("google/protobuf/"):
            continue
        try:
            pool.Add(proto)
            pool.FindFileByName(proto.name)
        except Exception as exc:  # noqa: BLE001 - the pool's errors are TypeError, KeyError, …
            raise InvalidSchema(f"Invalid schema: {proto.name}: {exc}") from None


def _add_well_known(pool: Any) -> None:
    import importlib

    for name in _WELL_KNOWN:
        module = importlib.import_module(f"google.protobuf.{name}_pb2")
        proto = _pb().FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        pool.Add(proto)


def _protoc(texts: dict[str, str], serialized: list[Any], targets: list[str]) -> Any:
    """Compile ``texts`` (import path → .proto text) with protoc in a child process."""
    pb = _pb()
    try:
        import grpc_tools  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        raise InvalidSchema(
            "Protobuf schema text needs protoc: pip install 'icefloe[schemas]'"
        ) from None
    well_known = str(importlib.resources.files(grpc_tools) / "_proto")
    with tempfile.TemporaryDirectory(prefix="icefloe-proto-") as folder:
        root = Path(folder) / "src"
        for name, text in texts.items():
            path = PurePosixPath(name)
            if path.is_absolute() or ".." in path.parts or not name.endswith(".proto"):
                raise InvalidSchema(f"Invalid schema: bad import path {name!r}")
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
        out = Path(folder) / "out.pb"
        args = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"--proto_path={root}",
            f"--proto_path={well_known}",
            "--include_imports",
            f"--descriptor_set_out={out}",
        ]
        if serialized:
            deps = Path(folder) / "deps.pb"
            deps.write_bytes(pb.FileDescriptorSet(file=serialized).SerializeToString())
            args.append(f"--descriptor_set_in={deps}")
        try:
            done = subprocess.run(
                [*args, *targets],
                cwd=folder,
                capture_output=True,
                timeout=PROTOC_TIMEOUT_S,
                env={"PATH": os.environ.get("PATH", "")},
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise InvalidSchema("Invalid schema: protoc took too long") from None
        if done.returncode != 0:
            errors = done.stderr.decode(errors="replace").replace(f"{root}/", "").strip()
            raise InvalidSchema(f"Invalid schema: {errors[-2000:] or 'protoc failed'}")
        files = pb.FileDescriptorSet.FromString(out.read_bytes())
    if serialized:
        known = {f.name for f in files.file}
        files.file.extend(p for p in serialized if p.name not in known)
    return files


def _main_file(files: Any, name: str) -> Any:
    for proto in files.file:
        if proto.name == name:
            return proto
    raise InvalidSchema(f"Invalid schema: {name} missing from its descriptors")


def parse(text: str, references: Sequence[Referenced] = ()) -> ParsedSchema:
    files, name = compile_set(text, references)
    main = _main_file(files, name)
    serialized = decode_serialized(text)
    canonical = (
        base64.b64encode(serialized.SerializeToString(deterministic=True)).decode()
        if serialized is not None
        else text.strip()
    )
    return ParsedSchema(SchemaType.PROTOBUF, canonical, main)


def serialized(text: str, references: Sequence[Referenced] = ()) -> str:
    """The schema as base64 of its ``FileDescriptorProto`` (Confluent's ``format=serialized``,
    which its Python clients ask for)."""
    if decode_serialized(text) is not None:
        return text
    files, name = compile_set(text, references)
    main = _main_file(files, name)
    return base64.b64encode(main.SerializeToString(deterministic=True)).decode()


# --- for decoders -------------------------------------------------------------------------------


async def resolve(
    schema: RegisteredSchema, lookup: SchemaLookup, depth: int = 0
) -> list[Referenced]:
    """The schema's references, each with its own, through ``lookup``.

    Raises:
        InvalidSchema: a reference is missing, or they nest too deeply (a cycle).
    """
    if depth > 32:
        raise InvalidSchema("references nest too deeply")
    found = []
    for reference in schema.references:
        target = await lookup.by_reference(reference)
        if target is None:
            raise InvalidSchema(
                f"reference {reference.name!r} ({reference.subject} version "
                f"{reference.version}) is not registered"
            )
        found.append(
            Referenced(reference.name, target, tuple(await resolve(target, lookup, depth + 1)))
        )
    return found


async def file_descriptor(schema: RegisteredSchema, lookup: SchemaLookup) -> Any:
    """A ``google.protobuf.descriptor.FileDescriptor`` of ``schema``, in a pool of its own
    holding its references (resolved through ``lookup``) and the well-known types.

    protoc runs in a child process: call this once per schema id and keep the result.

    Raises:
        InvalidSchema: the schema or a reference does not compile.
    """
    import asyncio

    from google.protobuf import descriptor_pool  # type: ignore[import-untyped, unused-ignore]

    references = await resolve(schema, lookup)
    files, name = await asyncio.to_thread(compile_set, schema.schema, references)
    pool = descriptor_pool.DescriptorPool()
    _add_well_known(pool)
    for proto in files.file:
        if not proto.name.startswith("google/protobuf/"):
            pool.Add(proto)
    return pool.FindFileByName(name)


def message_class(file: Any, indexes: Sequence[int] = (0,)) -> Any:
    """The message class Confluent's message indexes name in ``file`` (``[0]``: the first
    message; ``[1, 0]``: the first nested message of the second).

    Raises:
        InvalidSchema: an index is out of range.
    """
    from google.protobuf import message_factory  # type: ignore[import-untyped, unused-ignore]

    if not indexes:
        indexes = (0,)
    candidates = list(file.message_types_by_name.values())
    descriptor = None
    for index in indexes:
        if not 0 <= index < len(candidates):
            raise InvalidSchema(f"message index {index} out of range in {file.name}")
        descriptor = candidates[index]
        candidates = list(descriptor.nested_types)
    return message_factory.GetMessageClass(descriptor)


# --- compatibility ------------------------------------------------------------------------------

_SCALAR_GROUPS: Final = (
    {"TYPE_INT32", "TYPE_UINT32", "TYPE_INT64", "TYPE_UINT64", "TYPE_BOOL"},
    {"TYPE_SINT32", "TYPE_SINT64"},
    {"TYPE_FIXED32", "TYPE_SFIXED32"},
    {"TYPE_FIXED64", "TYPE_SFIXED64"},
    {"TYPE_STRING", "TYPE_BYTES"},
)
"""Types whose values read as one another on the wire (Confluent's compatible kinds)."""


def _messages(prefix: str, messages: Any, into: dict[str, Any]) -> dict[str, Any]:
    for message in messages:
        name = f"{prefix}.{message.name}"
        into[name] = message
        _messages(name, message.nested_type, into)
    return into


def _enums(prefix: str, file_or_message: Any, into: dict[str, Any]) -> dict[str, Any]:
    for enum in file_or_message.enum_type:
        into[f"{prefix}.{enum.name}"] = enum
    messages: Any = getattr(file_or_message, "message_type", None) or getattr(
        file_or_message, "nested_type", ()
    )
    for message in messages:
        _enums(f"{prefix}.{message.name}", message, into)
    return into


def incompatibilities(reader: Any, writer: Any) -> list[str]:
    pb = _pb()
    type_name = pb.FieldDescriptorProto.Type.Name
    found: list[str] = []
    if reader.package != writer.package:
        found.append(f"PACKAGE_CHANGED from {writer.package!r} to {reader.package!r}")
        return found
    prefix = f".{reader.package}" if reader.package else ""
    read, written = (
        _messages(prefix, reader.message_type, {}),
        _messages(prefix, writer.message_type, {}),
    )
    for name, old in written.items():
        new = read.get(name)
        if new is None:
            found.append(f"MESSAGE_REMOVED {name.lstrip('.')}")
            continue
        new_fields = {f.number: f for f in new.field}
        old_fields = {f.number: f for f in old.field}
        required = pb.FieldDescriptorProto.LABEL_REQUIRED
        repeated = pb.FieldDescriptorProto.LABEL_REPEATED
        for number, field in old_fields.items():
            where = f"{name.lstrip('.')}.{field.name} (field {number})"
            now = new_fields.get(number)
            if now is None:
                if field.label == required:
                    found.append(f"REQUIRED_FIELD_REMOVED {where}")
                continue
            before, after = type_name(field.type), type_name(now.type)
            if before != after and not any(before in g and after in g for g in _SCALAR_GROUPS):
                found.append(f"FIELD_KIND_CHANGED {where}: {before} to {after}")
            elif field.type_name != now.type_name:
                found.append(
                    f"FIELD_NAMED_TYPE_CHANGED {where}: {field.type_name} to {now.type_name}"
                )
            if (field.label == repeated) != (now.label == repeated):
                found.append(f"FIELD_LABEL_CHANGED {where}")
            in_oneof = now.HasField("oneof_index") and not now.proto3_optional
            was_in_oneof = field.HasField("oneof_index") and not field.proto3_optional
            if in_oneof and not was_in_oneof:
                found.append(f"FIELD_MOVED_TO_ONEOF {where}")
        for number, field in new_fields.items():
            if number not in old_fields and field.label == required:
                found.append(f"REQUIRED_FIELD_ADDED {name.lstrip('.')}.{field.name}")
    read_enums, written_enums = _enums(prefix, reader, {}), _enums(prefix, writer, {})
    for name, old_enum in written_enums.items():
        new_enum = read_enums.get(name)
        if new_enum is None:
            continue  # a removed enum shows as its fields' type change
        values = {v.number: v.name for v in new_enum.value}
        for value in old_enum.value:
            if values.get(value.number) != value.name:
                found.append(f"ENUM_CONST_CHANGED {name.lstrip('.')}.{value.name}")
    return found
