"""Kafka's ACL rules (deny beats allow, implied operations, wildcards, prefixes) and the ACL
store that every broker caches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from icefloe.config.security import AclOptions
from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
from icefloe.keyspace import ACLS
from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import MetadataStore
from icefloe.security.acl_store import AclStore
from icefloe.security.acls import (
    Acl,
    AclFilter,
    Entry,
    Operation,
    PatternType,
    Permission,
    Resource,
    ResourceType,
    acl_problem,
    authorized,
)
from icefloe.security.authorizer import Authorizer
from icefloe.security.tls import certificate_principal
from tests.support.waiting import eventually

TOPIC = ResourceType.TOPIC
ALICE = "User:alice"


def acl(
    name: str,
    operation: Operation,
    permission: Permission = Permission.ALLOW,
    principal: str = ALICE,
    *,
    pattern: PatternType = PatternType.LITERAL,
    host: str = "*",
    resource_type: ResourceType = TOPIC,
) -> Acl:
    return Acl(
        Resource(resource_type, name, pattern), Entry(principal, host, operation, permission)
    )


def allows(
    acls: list[Acl], operation: Operation, principal: str = ALICE, host: str = "10.0.0.1"
) -> bool:
    return authorized(acls, principal, host, operation, allow_if_none=False)


def test_an_allow_grants_only_its_operation_and_the_ones_it_implies() -> None:
    acls = [acl("t", Operation.READ)]
    assert allows(acls, Operation.READ)
    assert allows(acls, Operation.DESCRIBE)  # READ implies DESCRIBE
    assert not allows(acls, Operation.WRITE)
    assert not allows(acls, Operation.DESCRIBE_CONFIGS)
    assert allows([acl("t", Operation.ALTER_CONFIGS)], Operation.DESCRIBE_CONFIGS)
    assert allows([acl("t", Operation.ALL)], Operation.DELETE)


def test_a_deny_beats_any_allow() -> None:
    acls = [acl("t", Operation.ALL), acl("t", Operation.WRITE, Permission.DENY)]
    assert not allows(acls, Operation.WRITE)
    assert allows(acls, Operation.READ)
    # A deny of READ does not deny the DESCRIBE that READ would imply.
    assert allows(
        [acl("t", Operation.ALL), acl("t", Operation.READ, Permission.DENY)], Operation.DESCRIBE
    )
    assert not allows(
        [acl("t", Operation.READ), acl("t", Operation.ALL, Permission.DENY)], Operation.READ
    )


def test_wildcard_principal_and_host_and_a_specific_host() -> None:
    assert allows([acl("t", Operation.READ, principal="User:*")], Operation.READ, "User:bob")
    only_there = [acl("t", Operation.READ, host="10.0.0.9")]
    assert not allows(only_there, Operation.READ)
    assert allows(only_there, Operation.READ, host="10.0.0.9")
    assert not allows([acl("t", Operation.READ)], Operation.READ, "User:bob")


def test_no_acl_on_a_resource_denies_unless_everyone_is_allowed() -> None:
    assert not authorized([], ALICE, "h", Operation.READ, allow_if_none=False)
    assert authorized([], ALICE, "h", Operation.READ, allow_if_none=True)
    # An ACL for someone else counts as "an ACL on the resource".
    other = [acl("t", Operation.READ, principal="User:bob")]
    assert not authorized(other, ALICE, "h", Operation.READ, allow_if_none=True)


def test_patterns_cover_names_as_kafka_matches_them() -> None:
    prefixed = Resource(TOPIC, "orders-", PatternType.PREFIXED)
    assert prefixed.covers(TOPIC, "orders-eu")
    assert not prefixed.covers(TOPIC, "order")
    assert not prefixed.covers(ResourceType.GROUP, "orders-eu")
    assert Resource(TOPIC, "*").covers(TOPIC, "anything")
    assert not Resource(TOPIC, "orders").covers(TOPIC, "orders-eu")


def test_filters_select_as_describe_and_delete_acls_do() -> None:
    literal = acl("orders", Operation.READ)
    prefixed = acl("ord", Operation.WRITE, pattern=PatternType.PREFIXED)
    wildcard = acl("*", Operation.DESCRIBE, principal="User:bob")
    acls = [literal, prefixed, wildcard]

    def selected(acl_filter: AclFilter) -> list[Acl]:
        return [a for a in acls if acl_filter.matches(a)]

    assert selected(AclFilter()) == acls
    assert selected(AclFilter(name="orders", pattern=PatternType.LITERAL)) == [literal]
    assert selected(AclFilter(name="orders", pattern=PatternType.MATCH)) == acls
    assert selected(AclFilter(principal="User:bob")) == [wildcard]
    assert selected(AclFilter(operation=Operation.WRITE)) == [prefixed]
    assert selected(AclFilter(pattern=PatternType.PREFIXED)) == [prefixed]
    assert AclFilter(operation=Operation.UNKNOWN).problem() is not None


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (acl("t", Operation.ANY), "operation"),
        (acl("t", Operation.READ, Permission.ANY), "permission"),
        (acl("t", Operation.READ, pattern=PatternType.MATCH), "pattern"),
        (acl("t", Operation.READ, principal="alice"), "TYPE:NAME"),
        (acl("", Operation.READ), "resource name"),
        (acl("other", Operation.ALTER, resource_type=ResourceType.CLUSTER), "kafka-cluster"),
        (acl("t", Operation.READ, resource_type=ResourceType.ANY), "resource type"),
        (acl("*", Operation.READ, pattern=PatternType.PREFIXED), "PREFIXED"),
    ],
)
def test_an_acl_that_cannot_mean_anything_is_refused_with_the_reason(bad: Acl, words: str) -> None:
    problem = acl_problem(bad)
    assert problem is not None
    assert words in problem


def test_a_valid_acl_has_no_problem() -> None:
    assert acl_problem(acl("t", Operation.READ)) is None
    assert (
        acl_problem(acl("kafka-cluster", Operation.ALTER, resource_type=ResourceType.CLUSTER))
        is None
    )


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[MetadataStore]:
    store = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    yield store
    await store.close()


async def test_acls_added_through_one_broker_apply_on_another(metadata: MetadataStore) -> None:
    here, there = AclStore(metadata), AclStore(metadata)
    await here.start()
    await there.start()
    try:
        authorizer = Authorizer(AclOptions(enabled=True), there)
        assert not authorizer.allows(ALICE, "h", Operation.WRITE, TOPIC, "orders-eu")
        await here.add([acl("orders-", Operation.WRITE, pattern=PatternType.PREFIXED)])
        await eventually(lambda: authorizer.allows(ALICE, "h", Operation.WRITE, TOPIC, "orders-eu"))
        removed = await here.remove(AclFilter(resource_type=TOPIC, operation=Operation.WRITE))
        assert [a.resource.name for a in removed] == ["orders-"]
        await eventually(
            lambda: not authorizer.allows(ALICE, "h", Operation.WRITE, TOPIC, "orders-eu")
        )
        assert len(there) == 0
    finally:
        await here.close()
        await there.close()


async def test_adding_an_acl_twice_keeps_one(metadata: MetadataStore) -> None:
    store = AclStore(metadata)
    await store.start()
    try:
        await store.add([acl("t", Operation.READ), acl("t", Operation.READ)])
        await store.add([acl("t", Operation.READ)])
        assert store.matching(AclFilter()) == [acl("t", Operation.READ)]
    finally:
        await store.close()


async def test_a_corrupt_stored_acl_is_skipped_and_the_others_still_apply(
    metadata: MetadataStore,
) -> None:
    writer = AclStore(metadata)
    await writer.start()
    await writer.add([acl("t", Operation.READ, Permission.DENY)])
    await writer.close()
    await metadata.put(ACLS + "topic/literal/broken", b"\xc1 not msgpack")
    await metadata.put(ACLS + "no-such-type/literal/x", b"\x90")
    reader = AclStore(metadata)
    await reader.start()
    try:
        authorizer = Authorizer(
            AclOptions(enabled=True, allow_everyone_if_no_acl_found=True), reader
        )
        assert not authorizer.allows(ALICE, "h", Operation.READ, TOPIC, "t")
        assert authorizer.allows(ALICE, "h", Operation.READ, TOPIC, "other")
    finally:
        await reader.close()


def test_super_users_and_a_disabled_authorizer_allow_everything(metadata: MetadataStore) -> None:
    store = AclStore(metadata)  # holds no ACL
    assert Authorizer(AclOptions(enabled=False), store).allows(
        ALICE, "h", Operation.ALL, TOPIC, "t"
    )
    admin = Authorizer(AclOptions(enabled=True, super_users=["User:admin"]), store)
    assert admin.allows("User:admin", "h", Operation.DELETE, TOPIC, "t")
    assert not admin.allows(ALICE, "h", Operation.READ, TOPIC, "t")


def test_a_client_certificate_names_its_principal_as_kafka_does() -> None:
    # ssl.SSLSocket.getpeercert(): the subject's relative names, most general first.
    certificate = {
        "subject": (
            (("countryName", "US"),),
            (("organizationName", "Acme, Inc."),),
            (("organizationalUnitName", "eng"),),
            (("commonName", "alice"),),
        )
    }
    assert certificate_principal(certificate) == r"User:CN=alice,OU=eng,O=Acme\, Inc.,C=US"
    assert certificate_principal({}) is None
    assert certificate_principal(None) is None


async def test_a_name_too_long_to_store_is_refused_before_anything_is_stored(
    metadata: MetadataStore,
) -> None:
    store = AclStore(metadata)
    await store.start()
    try:
        with pytest.raises(ValueError, match="too long"):
            await store.add([acl("t", Operation.READ), acl("\u4e2d" * 400, Operation.READ)])
        assert store.matching(AclFilter()) == []
    finally:
        await store.close()
