"""Kafka's access control lists: what an ACL says, how filters select ACLs, and which ACLs
decide a request.

The codes are Kafka's own (``org.apache.kafka.common.acl`` and ``...resource``), since they
travel in CreateAcls, DescribeAcls and DeleteAcls. An ACL binds a resource pattern (a type, a
name, and whether the name is literal or a prefix) to an entry (principal, host, operation,
allow or deny). The decision rules are Kafka's: a matching deny beats any allow; DESCRIBE is
implied by READ, WRITE, DELETE and ALTER, DESCRIBE_CONFIGS by ALTER_CONFIGS, and ALL implies
everything; the literal name ``*`` and the principal ``User:*`` and host ``*`` are wildcards.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    """Filters only: every pattern that matches the filter's name (literal, wildcard, prefix)."""
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD: Final = "*"
"""As a literal resource name: every resource of the type; as a host: every host."""
WILDCARD_PRINCIPAL: Final = "User:*"
CLUSTER_NAME: Final = "kafka-cluster"
"""The one CLUSTER resource's name."""
MAX_NAME: Final = 249 * 2
"""Longest resource name an ACL may hold (twice Kafka's topic name limit; group and
transactional ids have none in Kafka, but every ACL becomes a store key)."""
MAX_PRINCIPAL: Final = 512
MAX_HOST: Final = 256

_IMPLIED: Final[dict[Operation, frozenset[Operation]]] = {
    Operation.DESCRIBE: frozenset(
        {Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER}
    ),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS}),
}

ANONYMOUS: Final = "User:ANONYMOUS"
"""The principal of a client that did not authenticate (Kafka's)."""


@dataclass(frozen=True, slots=True)
class Resource:
    """A resource pattern: what an ACL applies to."""

    type: ResourceType
    name: str
    pattern: PatternType = PatternType.LITERAL

    def covers(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this pattern applies to the resource ``name`` of ``resource_type``."""
        if self.type is not resource_type:
            return False
        if self.pattern is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name in (name, WILDCARD)


@dataclass(frozen=True, slots=True)
class Entry:
    """Who may, or may not, do what, from where."""

    principal: str
    host: str
    operation: Operation
    permission: Permission

    def applies_to(self, principal: str, host: str) -> bool:
        return self.principal in (principal, WILDCARD_PRINCIPAL) and self.host in (host, WILDCARD)


@dataclass(frozen=True, slots=True)
class Acl:
    resource: Resource
    entry: Entry


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Selects ACLs, as DescribeAcls and DeleteAcls do: ``None`` and ANY match anything."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def matches(self, acl: Acl) -> bool:
        resource, entry = acl.resource, acl.entry
        return (
            self.resource_type in (ResourceType.ANY, resource.type)
            and self._matches_pattern(resource)
            and self.principal in (None, entry.principal)
            and self.host in (None, entry.host)
            and self.operation in (Operation.ANY, entry.operation)
            and self.permission in (Permission.ANY, entry.permission)
        )

    def _matches_pattern(self, resource: Resource) -> bool:
        if self.pattern is PatternType.MATCH:
            # Every pattern that would apply to a resource of this name.
            if self.name is None:
                return True
            if resource.pattern is PatternType.PREFIXED:
                return self.name.startswith(resource.name)
            return resource.name in (self.name, WILDCARD)
        return self.pattern in (PatternType.ANY, resource.pattern) and self.name in (
            None,
            resource.name,
        )

    def problem(self) -> str | None:
        """Why this filter cannot be used, if it cannot (Kafka refuses UNKNOWN values)."""
        for value in (self.resource_type, self.pattern, self.operation, self.permission):
            if value.name == "UNKNOWN":
                return f"the filter's {type(value).__name__} is UNKNOWN"
        return None


def acl_problem(acl: Acl) -> str | None:
    """Why an ACL cannot be created, if it cannot; ``None`` when it is valid."""
    resource, entry = acl.resource, acl.entry
    if resource.type in (ResourceType.ANY, ResourceType.UNKNOWN):
        return f"an ACL needs a resource type, not {resource.type.name}"
    if resource.pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        return f"an ACL's pattern type is LITERAL or PREFIXED, not {resource.pattern.name}"
    if entry.operation in (Operation.ANY, Operation.UNKNOWN):
        return f"an ACL needs an operation, not {entry.operation.name}"
    if entry.permission not in (Permission.ALLOW, Permission.DENY):
        return f"an ACL's permission is ALLOW or DENY, not {entry.permission.name}"
    if not resource.name or len(resource.name) > MAX_NAME:
        return f"an ACL's resource name has 1 to {MAX_NAME} characters"
    if resource.type is ResourceType.CLUSTER and resource.name != CLUSTER_NAME:
        return f"the cluster resource is named {CLUSTER_NAME!r}, not {resource.name!r}"
    if resource.pattern is PatternType.PREFIXED and resource.name == WILDCARD:
        return "a PREFIXED pattern cannot be '*': use a LITERAL '*' for every resource"
    kind, colon, name = entry.principal.partition(":")
    if not colon or not kind or not name or len(entry.principal) > MAX_PRINCIPAL:
        return f"principal {entry.principal[:80]!r} is not TYPE:NAME (e.g. User:alice)"
    if not entry.host or len(entry.host) > MAX_HOST:
        return "an ACL's host is an address or '*'"
    return None


def authorized(
    acls: Iterable[Acl],
    principal: str,
    host: str,
    operation: Operation,
    *,
    allow_if_none: bool,
) -> bool:
    """Kafka's decision for ``operation`` given every ACL whose pattern covers the resource.

    A deny for the operation (or ALL) that applies to the principal and host wins; otherwise
    an allow for the operation, ALL, or an operation that implies it grants. With no ACL on
    the resource at all, ``allow_if_none`` decides (``allow.everyone.if.no.acl.found``).
    """
    allowing = _IMPLIED.get(operation, frozenset({operation})) | {Operation.ALL}
    denying = frozenset({operation, Operation.ALL})
    allowed = False
    found = False
    for acl in acls:
        found = True
        entry = acl.entry
        if not entry.applies_to(principal, host):
            continue
        if entry.permission is Permission.DENY and entry.operation in denying:
            return False
        if entry.permission is Permission.ALLOW and entry.operation in allowing:
            allowed = True
    return allowed or (allow_if_none and not found)


def authorized_on_some(
    acls: Iterable[Acl], principal: str, host: str, operation: Operation
) -> bool:
    """Whether ACLs allow ``operation`` on at least one resource of their type, as Kafka's
    ``authorizeByResourceType`` decides it (e.g. WRITE on any topic lets a producer be
    idempotent): some allow that applies is not covered by a deny that applies."""
    acls = list(acls)
    denying = frozenset({operation, Operation.ALL})
    denied = [
        a.resource
        for a in acls
        if a.entry.permission is Permission.DENY
        and a.entry.operation in denying
        and a.entry.applies_to(principal, host)
    ]
    if any(r.pattern is PatternType.LITERAL and r.name == WILDCARD for r in denied):
        return False
    allowing = _IMPLIED.get(operation, frozenset({operation})) | {Operation.ALL}
    for acl in acls:
        entry, resource = acl.entry, acl.resource
        if not (
            entry.permission is Permission.ALLOW
            and entry.operation in allowing
            and entry.applies_to(principal, host)
        ):
            continue
        if not any(_deny_covers(d, resource) for d in denied):
            return True
    return False


def _deny_covers(deny: Resource, allow: Resource) -> bool:
    if deny.pattern is PatternType.PREFIXED:
        return allow.name.startswith(deny.name)
    return allow.pattern is PatternType.LITERAL and allow.name == deny.name
