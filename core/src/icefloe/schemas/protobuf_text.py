"""A ``FileDescriptorProto`` printed back as ``.proto`` text, so that a schema Confluent's Python
serializer registered in base64 is served as text, as Confluent's registry serves it.

It prints what schemas of messages, enums and services hold (fields, maps, oneofs, proto3
optionals, proto2 defaults, reserved ranges, the common file options); a file with what it
does not print (groups, extensions, editions, custom options) gets ``None``, and the registry
serves the base64 form instead of a text that would compile to something else.
"""

from __future__ import annotations

import json
from typing import Any, Final

_SCALARS: Final = {
    1: "double",
    2: "float",
    3: "int64",
    4: "uint64",
    5: "int32",
    6: "fixed64",
    7: "fixed32",
    8: "bool",
    9: "string",
    12: "bytes",
    13: "uint32",
    15: "sfixed32",
    16: "sfixed64",
    17: "sint32",
    18: "sint64",
}
_MESSAGE, _ENUM, _GROUP = 11, 14, 10
_OPTIONAL, _REQUIRED, _REPEATED = 1, 2, 3
_FILE_OPTIONS: Final = (
    "java_package",
    "java_outer_classname",
    "java_multiple_files",
    "go_package",
    "csharp_namespace",
    "objc_class_prefix",
    "php_namespace",
    "ruby_package",
    "swift_prefix",
    "cc_enable_arenas",
    "optimize_for",
    "php_class_prefix",
    "php_metadata_namespace",
    "java_string_check_utf8",
    "java_generic_services",
    "cc_generic_services",
    "py_generic_services",
    "deprecated",
)


class _Unprintable(Exception):
    pass


def to_text(proto: Any) -> str | None:
    """The ``.proto`` text of ``proto``, or ``None`` where it holds what this does not print."""
    try:
        return "\n".join(_file(proto)) + "\n"
    except _Unprintable:
        return None


def _file(proto: Any) -> list[str]:
    syntax = proto.syntax or "proto2"
    if syntax not in ("proto2", "proto3") or proto.extension:
        raise _Unprintable
    lines = [f'syntax = "{syntax}";']
    if proto.package:
        lines.append(f"package {proto.package};")
    public = set(proto.public_dependency)
    for index, dependency in enumerate(proto.dependency):
        lines.append(f'import {"public " if index in public else ""}"{dependency}";')
    lines += _options(proto.options, _FILE_OPTIONS)
    for enum in proto.enum_type:
        lines += _enum(enum, "")
    for message in proto.message_type:
        lines += _message(message, "", syntax)
    for service in proto.service:
        lines.append(f"service {service.name} {{")
        for method in service.method:
            client = "stream " if method.client_streaming else ""
            server = "stream " if method.server_streaming else ""
            lines.append(
                f"  rpc {method.name} ({client}{method.input_type}) "
                f"returns ({server}{method.output_type});"
            )
        lines.append("}")
    return lines


def _options(options: Any, allowed: tuple[str, ...], indent: str = "") -> list[str]:
    lines = []
    for field, value in options.ListFields():
        if field.name not in allowed or field.is_extension:
            raise _Unprintable
        lines.append(f"{indent}option {field.name} = {_literal(value, field)};")
    return lines


def _literal(value: Any, field: Any = None) -> str:
    if field is not None and field.enum_type is not None:
        return str(field.enum_type.values_by_number[value].name)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _enum(enum: Any, indent: str) -> list[str]:
    lines = [f"{indent}enum {enum.name} {{"]
    lines += _options(enum.options, ("allow_alias",), indent + "  ")
    for value in enum.value:
        if value.options.ListFields():
            raise _Unprintable
        lines.append(f"{indent}  {value.name} = {value.number};")
    lines += _reserved(enum, indent, inclusive_end=True)
    lines.append(f"{indent}}}")
    return lines


def _reserved(container: Any, indent: str, inclusive_end: bool) -> list[str]:
    lines = []
    for span in container.reserved_range:
        end = span.end if inclusive_end else span.end - 1
        lines.append(
            f"{indent}  reserved {span.start};"
            if end == span.start
            else f"{indent}  reserved {span.start} to {end};"
        )
    if container.reserved_name:
        names = ", ".join(json.dumps(n) for n in container.reserved_name)
        lines.append(f"{indent}  reserved {names};")
    return lines


def _message(message: Any, indent: str, syntax: str) -> list[str]:
    if message.extension or message.extension_range:
        raise _Unprintable
    lines = [f"{indent}message {message.name} {{"]
    lines += _options(message.options, ("deprecated",), indent + "  ")
    maps = {n.name: n for n in message.nested_type if n.options.map_entry}
    for enum in message.enum_type:
        lines += _enum(enum, indent + "  ")
    for nested in message.nested_type:
        if nested.name not in maps:
            lines += _message(nested, indent + "  ", syntax)
    printed_oneofs: set[int] = set()
    for field in message.field:
        real_oneof = field.HasField("oneof_index") and not field.proto3_optional
        if not real_oneof:
            lines.append(f"{indent}  {_field(field, syntax, maps)}")
            continue
        if field.oneof_index in printed_oneofs:
            continue
        printed_oneofs.add(field.oneof_index)
        lines.append(f"{indent}  oneof {message.oneof_decl[field.oneof_index].name} {{")
        for member in message.field:
            if member.HasField("oneof_index") and member.oneof_index == field.oneof_index:
                lines.append(f"{indent}    {_field(member, syntax, maps, in_oneof=True)}")
        lines.append(f"{indent}  }}")
    lines += _reserved(message, indent, inclusive_end=False)
    lines.append(f"{indent}}}")
    return lines


def _field(field: Any, syntax: str, maps: dict[str, Any], in_oneof: bool = False) -> str:
    if field.type == _GROUP:
        raise _Unprintable
    entry = maps.get(field.type_name.rpartition(".")[2]) if field.type == _MESSAGE else None
    if entry is not None and field.label == _REPEATED:
        key, value = entry.field[0], entry.field[1]
        kind = f"map<{_type(key)}, {_type(value)}>"
        label = ""
    else:
        kind = _type(field)
        label = _label(field, syntax, in_oneof)
    options = []
    if field.HasField("default_value"):
        default = field.default_value
        if field.type == 12:
            default = f'"{default}"'  # bytes defaults are kept C-escaped already
        elif field.type == 9:
            default = json.dumps(default)
        options.append(f"default = {default}")
    if field.json_name and field.json_name != _camel(field.name):
        options.append(f"json_name = {json.dumps(field.json_name)}")
    for option, value in field.options.ListFields():
        if option.name not in ("packed", "deprecated") or option.is_extension:
            raise _Unprintable
        options.append(f"{option.name} = {_literal(value, option)}")
    suffix = f" [{', '.join(options)}]" if options else ""
    return f"{label}{kind} {field.name} = {field.number}{suffix};"


def _type(field: Any) -> str:
    if field.type in (_MESSAGE, _ENUM):
        return str(field.type_name)
    return _SCALARS[field.type]


def _label(field: Any, syntax: str, in_oneof: bool) -> str:
    if field.label == _REPEATED:
        return "repeated "
    if in_oneof:
        return ""
    if syntax == "proto2":
        return "required " if field.label == _REQUIRED else "optional "
    return "optional " if field.proto3_optional else ""


def _camel(name: str) -> str:
    """protoc's default JSON name: lowerCamelCase of the field name."""
    parts = name.split("_")
    return parts[0] + "".join(p[:1].upper() + p[1:] for p in parts[1:])
