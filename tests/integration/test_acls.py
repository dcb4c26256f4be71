"""ACLs through real clients: for each group of APIs a principal that is allowed and one that
is not, as `icefloe serve` with ``[security.acls] enabled`` answers confluent-kafka and
kafka-python; deny beats allow; prefixed patterns; super users; ACLs managed with the Admin
API (CreateAcls, DescribeAcls, DeleteAcls)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.test_security import icefloe_users
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_jvm import ACLS, run_java

SET = AlterConfigOpType.SET
PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}


@dataclass
class Cluster:
    icefloe: RunningIcefloe

    def config(self, user: str) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.icefloe.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-256",
            "sasl.username": user,
            "sasl.password": PASSWORDS[user],
        }

    def admin(self, user: str) -> AdminClient:
        return AdminClient(self.config(user))


def allow(
    resource: ResourceType,
    name: str,
    operation: AclOperation,
    *,
    principal: str = "User:alice",
    pattern: ResourcePatternType = ResourcePatternType.LITERAL,
    permission: AclPermissionType = AclPermissionType.ALLOW,
) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, "*", operation, permission)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    data = tmp_path_factory.mktemp("acls") / "data"
    for user, password in PASSWORDS.items():
        added = icefloe_users(data, "add", user, "--password-stdin", password=password)
        assert added.returncode == 0, added.stderr
    running = start_icefloe(
        data,
        env={
            "ICEFLOE_SECURITY__PROTOCOL": "SASL_PLAINTEXT",
            "ICEFLOE_SECURITY__SASL_MECHANISMS": '["SCRAM-SHA-256"]',
            "ICEFLOE_SECURITY__ACLS__ENABLED": "true",
            "ICEFLOE_SECURITY__ACLS__SUPER_USERS": '["User:admin"]',
        },
    )
    try:
        made = Cluster(running)
        admin = made.admin("admin")
        for topic in ("orders", "ledger", "hidden", "catalog"):
            admin.create_topics([NewTopic(topic, 1)])[topic].result(30)
        bindings = [
            allow(ResourceType.TOPIC, "orders", AclOperation.WRITE),
            allow(ResourceType.TOPIC, "orders", AclOperation.READ),
            allow(ResourceType.TOPIC, "orders", AclOperation.DESCRIBE_CONFIGS),
            allow(ResourceType.TOPIC, "catalog", AclOperation.DESCRIBE, principal="User:bob"),
            allow(
                ResourceType.GROUP, "app-", AclOperation.READ, pattern=ResourcePatternType.PREFIXED
            ),
            allow(
                ResourceType.TOPIC, "alice-", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED
            ),
            # Deny beats allow: everything on ledger but writing to it.
            allow(ResourceType.TOPIC, "ledger", AclOperation.ALL),
            allow(
                ResourceType.TOPIC,
                "ledger",
                AclOperation.WRITE,
                permission=AclPermissionType.DENY,
            ),
        ]
        for future in admin.create_acls(bindings).values():
            future.result(30)
        yield made
    finally:
        running.stop()


def produce(config: dict[str, Any], topic: str) -> KafkaError | None:
    """Produce one record; the delivery error, if any."""
    producer = Producer({**config, "message.timeout.ms": 10_000})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"v", on_delivery=lambda error, _m: outcome.append(error))
    producer.flush(20)
    assert outcome, "no delivery report"
    return outcome[0]


def test_produce_needs_write_on_the_topic(cluster: Cluster) -> None:
    assert produce(cluster.config("alice"), "orders") is None
    error = produce(cluster.config("bob"), "orders")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_deny_beats_an_allow_of_all(cluster: Cluster) -> None:
    error = produce(cluster.config("alice"), "ledger")
    assert error is not None
    assert error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # ... while what ALL allows and no deny names still works: reading.
    consumer = Consumer({**cluster.config("alice"), "group.id": "app-ledger"})
    try:
        consumer.assign([TopicPartition("ledger", 0, 0)])
        assert consumer.poll(3) is None  # an empty log, read without an error
    finally:
        consumer.close()


def test_consuming_needs_read_on_the_topic_and_on_the_group(cluster: Cluster) -> None:
    assert produce(cluster.config("alice"), "orders") is None
    consumer = Consumer(
        {**cluster.config("alice"), "group.id": "app-1", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe(["orders"])
        message = consumer.poll(30)
        assert message is not None
        assert message.error() is None
        consumer.commit(message, asynchronous=False)
    finally:
        consumer.close()
    # The same consumer in a group outside the "app-" prefix is refused.
    outsider = Consumer({**cluster.config("alice"), "group.id": "other-group"})
    try:
        outsider.subscribe(["orders"])
        message = outsider.poll(15)
        assert message is not None
        assert message.error() is not None
        assert message.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        outsider.close()


def test_fetch_without_read_is_refused(cluster: Cluster) -> None:
    # Bob may describe the topic (Metadata answers it) but not read it.
    from kafka import KafkaConsumer
    from kafka import TopicPartition as PartitionOf
    from kafka.errors import TopicAuthorizationFailedError

    consumer = KafkaConsumer(
        bootstrap_servers=cluster.icefloe.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_plain_username="bob",
        sasl_plain_password=PASSWORDS["bob"],
    )
    try:
        consumer.assign([PartitionOf("catalog", 0)])
        consumer.seek(PartitionOf("catalog", 0), 0)
        with pytest.raises(TopicAuthorizationFailedError):
            poll_until_raised(consumer)
    finally:
        consumer.close()


def poll_until_raised(consumer: Any) -> None:
    for _ in range(20):
        consumer.poll(500)


def test_metadata_lists_only_the_topics_one_may_describe(cluster: Cluster) -> None:
    alice = set(cluster.admin("alice").list_topics(timeout=10).topics)
    assert {"orders", "ledger"} <= alice
    assert "hidden" not in alice
    assert "orders" not in set(cluster.admin("bob").list_topics(timeout=10).topics)
    named = cluster.admin("bob").list_topics("orders", timeout=10).topics["orders"]
    assert named.error is not None
    assert named.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_creating_and_deleting_topics_follow_prefixed_acls(cluster: Cluster) -> None:
    alice = cluster.admin("alice")
    alice.create_topics([NewTopic("alice-scratch", 1)])["alice-scratch"].result(30)
    with pytest.raises(KafkaException) as refused:
        alice.create_topics([NewTopic("scratch", 1)])["scratch"].result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    bob = cluster.admin("bob")
    with pytest.raises(KafkaException) as not_bobs:
        bob.delete_topics(["alice-scratch"])["alice-scratch"].result(30)
    assert not_bobs.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    alice.delete_topics(["alice-scratch"])["alice-scratch"].result(30)


def test_describing_configs_needs_describe_configs(cluster: Cluster) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, "orders")
    alice, bob = cluster.admin("alice"), cluster.admin("bob")
    configs = alice.describe_configs([resource])[resource].result(30)
    assert "cleanup.policy" in configs
    with pytest.raises(KafkaException) as refused:
        bob.describe_configs([resource])[resource].result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    change = ConfigResource(
        ConfigResource.Type.TOPIC,
        "orders",
        incremental_configs=[ConfigEntry("retention.ms", "1000", incremental_operation=SET)],
    )
    with pytest.raises(KafkaException) as not_altered:
        alice.incremental_alter_configs([change])[change].result(30)
    assert not_altered.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_groups_are_listed_and_described_only_for_those_allowed(cluster: Cluster) -> None:
    consumer = Consumer({**cluster.config("alice"), "group.id": "app-listed"})
    consumer.subscribe(["orders"])
    consumer.poll(5)
    consumer.close()
    alice, bob = cluster.admin("alice"), cluster.admin("bob")
    listed = alice.list_consumer_groups().result(30)
    assert "app-listed" in {g.group_id for g in listed.valid}
    by_bob = bob.list_consumer_groups().result(30)
    assert "app-listed" not in {g.group_id for g in by_bob.valid}
    described = bob.describe_consumer_groups(["app-listed"])["app-listed"]
    with pytest.raises(KafkaException) as refused:
        described.result(30)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_cluster_operations_need_acls_on_the_cluster(cluster: Cluster) -> None:
    bob, admin = cluster.admin("bob"), cluster.admin("admin")
    # The operations each may perform on the cluster, as the broker reports them.
    by_bob = bob.describe_cluster(include_authorized_operations=True).result(30)
    assert not by_bob.authorized_operations
    by_admin = admin.describe_cluster(include_authorized_operations=True).result(30)
    assert AclOperation.ALTER in by_admin.authorized_operations
    grab = allow(ResourceType.TOPIC, "*", AclOperation.ALL, principal="User:bob")
    with pytest.raises(KafkaException) as not_allowed:
        next(iter(bob.create_acls([grab]).values())).result(30)
    assert not_allowed.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_acls_are_described_and_deleted_and_then_no_longer_allow(cluster: Cluster) -> None:
    admin = cluster.admin("admin")
    binding = allow(ResourceType.TOPIC, "hidden", AclOperation.READ, principal="User:bob")
    next(iter(admin.create_acls([binding]).values())).result(30)
    by_bob = AclBindingFilter(
        ResourceType.TOPIC,
        "hidden",
        ResourcePatternType.ANY,
        "User:bob",
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    assert admin.describe_acls(by_bob).result(30) == [binding]
    # The new ACL applies at once (the broker's cache follows the store).
    assert "hidden" in set(cluster.admin("bob").list_topics(timeout=10).topics)
    deleted = next(iter(admin.delete_acls([by_bob]).values())).result(30)
    assert deleted == [binding]
    assert admin.describe_acls(by_bob).result(30) == []
    assert "hidden" not in set(cluster.admin("bob").list_topics(timeout=10).topics)


def test_an_invalid_acl_is_refused_with_the_reason(cluster: Cluster) -> None:
    wrong = allow(ResourceType.BROKER, "not-the-cluster", AclOperation.ALTER)
    admin = cluster.admin("admin")
    with pytest.raises(KafkaException) as refused:
        next(iter(admin.create_acls([wrong]).values())).result(30)
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "kafka-cluster" in refused.value.args[0].str()


def test_without_acls_enabled_managing_them_says_so(tmp_path: Path) -> None:
    from kafka.admin import (
        ACLFilter,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        KafkaAdminClient,
        ResourcePatternFilter,
    )
    from kafka.admin import ResourceType as Kind
    from kafka.errors import SecurityDisabledError

    running = start_icefloe(tmp_path / "data")
    admin = KafkaAdminClient(bootstrap_servers=running.bootstrap)
    try:
        everything = ACLFilter(
            principal=None,
            host="*",
            operation=ACLOperation.ANY,
            permission_type=ACLPermissionType.ANY,
            resource_pattern=ResourcePatternFilter(Kind.ANY, None, ACLResourcePatternType.ANY),
        )
        with pytest.raises(SecurityDisabledError, match=r"\[security.acls\] enabled"):
            admin.describe_acls(everything)
    finally:
        admin.close()
        running.stop()


def login_properties(cluster: Cluster, user: str, folder: Path) -> Path:
    path = folder / f"{user}.properties"
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        "sasl.mechanism=SCRAM-SHA-256\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{user}" password="{PASSWORDS[user]}";\n'
    )
    return path


def test_kafka_acls_and_the_java_producer(cluster: Cluster, tmp_path: Path) -> None:
    admin = login_properties(cluster, "admin", tmp_path)
    acls = [ACLS, "--bootstrap-server", cluster.icefloe.bootstrap]
    acls += ["--command-config", str(admin)]
    added = run_java(*acls, "--add", "--allow-principal", "User:bob", "--operation", "Write",
                 "--topic", "java-", "--resource-pattern-type", "prefixed")  # fmt: skip
    assert added.returncode == 0, added.stderr
    listed = run_java(*acls, "--list", "--topic", "java-", "--resource-pattern-type", "prefixed")
    assert "principal=User:bob, host=*, operation=WRITE, permissionType=ALLOW" in listed.stdout

    def java_producer(user: str, topic: str) -> subprocess.CompletedProcess[str]:
        # Idempotent by default: InitProducerId needs WRITE on some topic.
        login = login_properties(cluster, user, tmp_path)
        return run_java(
            "org.apache.kafka.tools.ProducerPerformance",
            "--topic", topic, "--num-records", "10", "--record-size", "100",
            "--throughput", "-1", "--producer.config", str(login),
            "--producer-props", f"bootstrap.servers={cluster.icefloe.bootstrap}",
            "max.block.ms=15000", "delivery.timeout.ms=15000", "request.timeout.ms=10000",
        )  # fmt: skip

    creator = cluster.admin("admin")
    creator.create_topics([NewTopic("java-orders", 1)])["java-orders"].result(30)
    allowed = java_producer("bob", "java-orders")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "10 records sent" in allowed.stdout
    denied = java_producer("alice", "java-orders")
    assert "TopicAuthorizationException" in denied.stdout + denied.stderr

    removed = run_java(*acls, "--remove", "--force", "--allow-principal", "User:bob",
                   "--operation", "Write", "--topic", "java-", "--resource-pattern-type",
                   "prefixed")  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    listed = run_java(*acls, "--list", "--topic", "java-", "--resource-pattern-type", "prefixed")
    assert "User:bob" not in listed.stdout
