"""The error codes a Kafka response carries, wherever its schema puts them.

A response answers errors per topic, partition, group or record batch, nested to any depth; the
metrics count each one. Walking every field of every response would cost the hot path (a
produce or fetch response with many partitions) a lot, so each response class is studied once:
which of its fields are error codes and which hold nested entities that may contain some.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterator
from typing import Any

from kio.schema.errors import ErrorCode


@dataclasses.dataclass(frozen=True, slots=True)
class _Plan:
    codes: tuple[str, ...]
    """Fields holding an ErrorCode."""
    entities: tuple[str, ...]
    """Fields holding a nested entity."""
    sequences: tuple[str, ...]
    """Fields holding a tuple of nested entities."""

    @property
    def empty(self) -> bool:
        return not (self.codes or self.entities or self.sequences)


def errors_in(body: Any) -> Iterator[ErrorCode]:
    """Every error code other than NONE in ``body`` (a kio response entity)."""
    cls: Any = type(body)
    plan = _plan(cls)
    for name in plan.codes:
        code = getattr(body, name)
        if code is not None and code is not ErrorCode.none:
            yield code
    for name in plan.entities:
        nested = getattr(body, name)
        if nested is not None:
            yield from errors_in(nested)
    for name in plan.sequences:
        for nested in getattr(body, name):
            yield from errors_in(nested)


@functools.cache
def _plan(cls: Any) -> _Plan:
    codes: list[str] = []
    entities: list[str] = []
    sequences: list[str] = []
    for field in dataclasses.fields(cls):
        kind = _unoptional(field.type)
        if kind is ErrorCode:
            codes.append(field.name)
        elif _holds_errors(kind):
            entities.append(field.name)
        elif typing.get_origin(kind) is tuple:
            (item, *_) = typing.get_args(kind) or (None,)
            if _holds_errors(item):
                sequences.append(field.name)
    return _Plan(tuple(codes), tuple(entities), tuple(sequences))


def _holds_errors(kind: Any) -> bool:
    return dataclasses.is_dataclass(kind) and isinstance(kind, type) and not _plan(kind).empty


def _unoptional(kind: Any) -> Any:
    """``X`` for ``X | None``; anything else unchanged."""
    if typing.get_origin(kind) in (typing.Union, _UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


_UnionType = type(int | None)
