"""What each topic's table is called: an identifier from a template, or the topic's alias.

The cluster-wide template is ``[table] identifier`` (``icefloe.{topic}``); a topic may set its
own with the topic config ``icefloe.table.identifier`` (an alias, which may use ``{topic}``
too). ``{topic}`` is the topic's name with ``.`` replaced by ``_``, because catalogs read a dot
as a namespace separator. Everything before the last dot is the namespace (nested namespaces
are dotted), the rest the table name. Two topics may not resolve to the same identifier.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Self

DEFAULT_TEMPLATE: Final = "icefloe.{topic}"
IDENTIFIER_CONFIG: Final = "icefloe.table.identifier"
"""The topic config of a topic's own identifier (empty or absent: the cluster's template)."""
_PART: Final = re.compile(r"[A-Za-z0-9_-]+")
_SAMPLE_TOPIC: Final = "t"


@dataclass(frozen=True, slots=True)
class TableName:
    """A table identifier: ``namespace.name`` (the namespace may itself be dotted)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}.{self.name}"

    @classmethod
    def parse(cls, identifier: str) -> Self:
        """Raises ``ValueError`` naming what is wrong with ``identifier``."""
        parts = identifier.split(".")
        if len(parts) < 2:
            raise ValueError(
                f"table identifier {identifier!r} needs a namespace: write it as "
                "'<namespace>.<table>', e.g. 'icefloe.{topic}'"
            )
        for part in parts:
            if not _PART.fullmatch(part):
                raise ValueError(
                    f"table identifier {identifier!r}: each dot-separated part must be letters, "
                    "digits, '_' or '-', and not empty"
                )
        return cls(".".join(parts[:-1]), parts[-1])


def check_template(template: str) -> str:
    """``template`` trimmed, if it makes valid identifiers; else ``ValueError`` saying why."""
    template = template.strip()
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template)]
    except ValueError as exc:
        raise ValueError(f"table identifier template {template!r}: {exc}") from None
    if any(f != "topic" or spec or conv for f, spec, conv in fields if f is not None):
        raise ValueError(
            f"table identifier template {template!r}: the only placeholder is {{topic}}"
        )
    TableName.parse(template.format(topic=_SAMPLE_TOPIC))
    return template


def table_name(template: str, topic: str) -> TableName:
    """The identifier ``template`` (already checked) gives ``topic``."""
    return TableName.parse(template.format(topic=topic.replace(".", "_")))


def topic_table_name(template: str, topic: str, configs: Mapping[str, str]) -> TableName:
    """The identifier of ``topic``'s table: its alias if it has one, else ``template``'s."""
    return table_name(configs.get(IDENTIFIER_CONFIG) or template, topic)
