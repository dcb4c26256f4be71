"""Topic and config administration through real admin clients against `icefloe serve`.

confluent-kafka (librdkafka), kafka-python and aiokafka each create, describe, alter and delete
through their own admin API, and each gets Kafka's precise error codes for bad requests. What
none of them sends (a topic named twice, a v4 DescribeConfigs asking for documentation, a
DescribeCluster for controllers, a request to one chosen broker) goes through a bare socket.

One `icefloe serve` is shared by the module's tests; each test works on its own topic.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import kafka.errors
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AioNewPartitions
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioResourceType
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpResourceType
from kafka.admin import KafkaAdminClient
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.admin import NewTopic as KpNewTopic
from kio.schema.errors import ErrorCode

from tests.support import admin_wire
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.topics import own_topic_name

TIMEOUT = 30
_TIMEDELTA = datetime.timedelta(seconds=TIMEOUT)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("admin") / "data")
    yield running
    running.stop()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name of this test's own."""
    return own_topic_name(request)


# --- confluent-kafka -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def confluent(cluster: RunningIcefloe) -> AdminClient:
    return AdminClient({"bootstrap.servers": cluster.bootstrap})


def done(futures: dict[Any, Future[Any]]) -> Any:
    """The result of the one future of a confluent-kafka admin call."""
    (future,) = futures.values()
    return future.result(timeout=TIMEOUT)


def failed(futures: dict[Any, Future[Any]]) -> int:
    """The Kafka error code of the one future of a confluent-kafka admin call."""
    with pytest.raises(KafkaException) as caught:
        done(futures)
    error: KafkaError = caught.value.args[0]
    return error.code()


def partition_count(admin: AdminClient, name: str) -> int:
    return len(admin.list_topics(name, timeout=TIMEOUT).topics[name].partitions)


def confluent_configs(admin: AdminClient, name: str) -> dict[str, ConfigEntry]:
    configs: dict[str, ConfigEntry] = done(
        admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
    )
    return configs


def test_confluent_creates_a_topic_with_its_partition_count(
    confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 3, 1)]))
    assert partition_count(confluent, topic) == 3


def test_confluent_describes_configs_set_at_creation_and_defaults(
    confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "1000"})]))
    configs = confluent_configs(confluent, topic)
    retention, policy = configs["retention.ms"], configs["cleanup.policy"]
    assert (retention.value, retention.source) == ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (policy.value, policy.source) == ("delete", ConfigSource.DEFAULT_CONFIG.value)


def test_confluent_a_replication_factor_of_three_is_accepted_and_one_replica_named(
    confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 2, 3)]))
    partitions = confluent.list_topics(topic, timeout=TIMEOUT).topics[topic].partitions
    assert [(p.replicas, p.isrs) for p in partitions.values()] == [
        ([p.leader], [p.leader]) for p in partitions.values()
    ]


def test_confluent_validate_only_creates_nothing(confluent: AdminClient, topic: str) -> None:
    done(confluent.create_topics([NewTopic(topic, 2, 1)], validate_only=True))
    assert topic not in confluent.list_topics(timeout=TIMEOUT).topics


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_confluent_alter_configs_replaces_the_whole_set(confluent: AdminClient, topic: str) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})]))
    resource = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.ms": "5000"})
    done(confluent.alter_configs([resource]))
    configs = confluent_configs(confluent, topic)
    assert configs["retention.ms"].value == "5000"
    assert configs["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value


def test_confluent_incremental_alter_appends_to_a_list_config(
    confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1)]))
    append = ConfigEntry(
        "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND
    )
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[append])
    done(confluent.incremental_alter_configs([resource]))
    assert confluent_configs(confluent, topic)["cleanup.policy"].value == "delete,compact"


def test_confluent_creates_partitions(confluent: AdminClient, topic: str) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1)]))
    done(confluent.create_partitions([NewPartitions(topic, 4)]))
    assert partition_count(confluent, topic) == 4


def test_confluent_deletes_a_topic(confluent: AdminClient, topic: str) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1)]))
    done(confluent.delete_topics([topic]))
    assert topic not in confluent.list_topics(timeout=TIMEOUT).topics


def test_confluent_describe_cluster_names_the_broker_and_cluster(
    confluent: AdminClient, cluster: RunningIcefloe
) -> None:
    described = confluent.describe_cluster().result(timeout=TIMEOUT)
    assert [node.port for node in described.nodes] == [cluster.port]
    assert described.controller.id == described.nodes[0].id
    assert described.cluster_id


def test_confluent_describes_broker_settings_read_only(confluent: AdminClient) -> None:
    node = confluent.describe_cluster().result(timeout=TIMEOUT).nodes[0]
    configs = done(confluent.describe_configs([ConfigResource(ResourceType.BROKER, str(node.id))]))
    assert configs["broker.id"].value == str(node.id)
    assert configs["num.partitions"].value == "1"
    assert all(entry.is_read_only for entry in configs.values())


def test_confluent_existing_topic_is_topic_already_exists(
    confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1)]))
    assert failed(confluent.create_topics([NewTopic(topic, 1, 1)])) == (
        KafkaError.TOPIC_ALREADY_EXISTS
    )


def test_confluent_bad_topic_name_is_invalid_topic(confluent: AdminClient) -> None:
    code = failed(confluent.create_topics([NewTopic("no spaces please", 1, 1)]))
    assert code == KafkaError.TOPIC_EXCEPTION


def test_confluent_unknown_config_key_is_invalid_config(confluent: AdminClient, topic: str) -> None:
    code = failed(confluent.create_topics([NewTopic(topic, 1, 1, config={"retention.mss": "1"})]))
    assert code == KafkaError.INVALID_CONFIG


def test_confluent_bad_config_value_is_invalid_config(confluent: AdminClient, topic: str) -> None:
    config = {"message.timestamp.type": "Now"}
    assert failed(confluent.create_topics([NewTopic(topic, 1, 1, config=config)])) == (
        KafkaError.INVALID_CONFIG
    )


def test_confluent_topics_that_differ_only_in_dot_and_underscore_collide(
    confluent: AdminClient, topic: str
) -> None:
    dotted = topic.replace("_", "-") + ".x"
    done(confluent.create_topics([NewTopic(dotted, 1, 1)]))
    code = failed(confluent.create_topics([NewTopic(dotted.replace(".", "_"), 1, 1)]))
    assert code == KafkaError.TOPIC_EXCEPTION  # both would be the table icefloe.<…>_x


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated:DeprecationWarning")
def test_confluent_a_table_alias_another_topic_has_is_invalid_config(
    confluent: AdminClient, topic: str
) -> None:
    alias = {"icefloe.table.identifier": f"sales.{topic.replace('.', '_')}"}
    done(confluent.create_topics([NewTopic(topic + "-a", 1, 1, config=alias)]))
    done(confluent.create_topics([NewTopic(topic + "-b", 1, 1)]))
    resource = ConfigResource(ResourceType.TOPIC, topic + "-b", set_config=alias)
    assert failed(confluent.alter_configs([resource])) == KafkaError.INVALID_CONFIG
    bad = {"icefloe.table.identifier": "no_namespace"}
    code = failed(confluent.create_topics([NewTopic(topic + "-c", 1, 1, config=bad)]))
    assert code == KafkaError.INVALID_CONFIG


def test_confluent_shrinking_partitions_is_invalid_partitions(
    confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 3, 1)]))
    code = failed(confluent.create_partitions([NewPartitions(topic, 2)]))
    assert code == KafkaError.INVALID_PARTITIONS


def test_confluent_deleting_an_unknown_topic_is_unknown_topic(confluent: AdminClient) -> None:
    code = failed(confluent.delete_topics(["never-created"]))
    assert code == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_describing_an_unknown_topic_is_unknown_topic(confluent: AdminClient) -> None:
    code = failed(confluent.describe_configs([ConfigResource(ResourceType.TOPIC, "never-created")]))
    assert code == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_altering_a_broker_setting_is_invalid_request(confluent: AdminClient) -> None:
    node = confluent.describe_cluster().result(timeout=TIMEOUT).nodes[0]
    change = ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.BROKER, str(node.id), incremental_configs=[change])
    assert failed(confluent.incremental_alter_configs([resource])) == KafkaError.INVALID_REQUEST


# --- kafka-python ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kafka_python(cluster: RunningIcefloe) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    yield admin
    admin.close()


def kp_configs(admin: KafkaAdminClient, name: str, **options: Any) -> dict[str, Any]:
    options.setdefault("config_filter", "all")
    described = admin.describe_configs([KpConfigResource(KpResourceType.TOPIC, name)], **options)
    configs: dict[str, Any] = described["topic"][name]
    return configs


def test_kafka_python_create_reports_partitions_replication_configs_and_id(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    created = kafka_python.create_topics(
        [KpNewTopic(topic, 2, 3, topic_configs={"retention.ms": "1000"})]
    )
    (result,) = created["topics"]
    assert (result["num_partitions"], result["replication_factor"]) == (2, 1)
    assert result["configs"]["retention.ms"]["value"] == "1000"
    assert result["configs"]["retention.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert uuid.UUID(str(result["topic_id"]))


def test_kafka_python_describe_configs_lists_synonyms_and_types(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 1, 1, topic_configs={"retention.ms": "1000"})])
    retention = kp_configs(kafka_python, topic, include_synonyms=True)["retention.ms"]
    assert retention["config_type"] == "LONG"
    assert [(s["value"], s["source"]) for s in retention["synonyms"]] == [
        ("1000", "DYNAMIC_TOPIC_CONFIG"),
        ("604800000", "DEFAULT_CONFIG"),
    ]


def test_kafka_python_incremental_alter_sets_and_deletes(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 1, 1, topic_configs={"segment.ms": "60000"})])
    changes = {"retention.ms": "2000", "segment.ms": ("DELETE", None)}
    kafka_python.alter_configs([KpConfigResource(KpResourceType.TOPIC, topic, configs=changes)])
    configs = kp_configs(kafka_python, topic)
    assert configs["retention.ms"]["value"] == "2000"
    assert configs["segment.ms"]["config_source"] == "DEFAULT_CONFIG"


def test_kafka_python_legacy_reset_returns_every_config_to_its_default(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    configs = {"segment.ms": "60000", "retention.ms": "2000"}
    kafka_python.create_topics([KpNewTopic(topic, 1, 1, topic_configs=configs)])
    # Without keys and without IncrementalAlterConfigs, kafka-python sends an AlterConfigs
    # with an empty config set: the whole set is replaced by nothing.
    resource = KpConfigResource(KpResourceType.TOPIC, topic, configs={})
    kafka_python.reset_configs([resource], incremental=False)
    assert kp_configs(kafka_python, topic, config_filter="modified") == {}


def test_kafka_python_subtract_on_a_non_list_config_is_invalid_config(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 1, 1)])
    changes = {"retention.ms": ("SUBTRACT", "1")}
    resource = KpConfigResource(KpResourceType.TOPIC, topic, configs=changes)
    # kafka-python reports per-resource errors as strings rather than raising them.
    outcome = kafka_python.alter_configs([resource])["topic"][topic]
    assert outcome.startswith("[Error 40] InvalidConfigurationError")


def test_kafka_python_validate_only_create_partitions_changes_nothing(
    kafka_python: KafkaAdminClient, confluent: AdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 1, 1)])
    kafka_python.create_partitions({topic: KpNewPartitions(3)}, validate_only=True)
    assert partition_count(confluent, topic) == 1


def test_kafka_python_creates_partitions(
    kafka_python: KafkaAdminClient, confluent: AdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 1, 1)])
    kafka_python.create_partitions({topic: KpNewPartitions(3)})
    assert partition_count(confluent, topic) == 3


def test_kafka_python_shrinking_partitions_is_invalid_partitions(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 2, 1)])
    with pytest.raises(kafka.errors.InvalidPartitionsError):
        kafka_python.create_partitions({topic: KpNewPartitions(1)})


def test_kafka_python_deletes_a_topic_by_id(
    kafka_python: KafkaAdminClient, confluent: AdminClient, topic: str
) -> None:
    (created,) = kafka_python.create_topics([KpNewTopic(topic, 1, 1)])["topics"]
    topic_id = uuid.UUID(str(created["topic_id"]))
    (deleted,) = kafka_python.delete_topics([topic_id])["topics"]
    assert (deleted["name"], deleted["error_code"]) == (topic, 0)
    assert topic not in confluent.list_topics(timeout=TIMEOUT).topics


def test_kafka_python_deleting_an_unknown_topic_id_is_unknown_topic_id(
    kafka_python: KafkaAdminClient,
) -> None:
    with pytest.raises(kafka.errors.UnknownTopicIdError):
        kafka_python.delete_topics([uuid.uuid4()])


def test_kafka_python_existing_topic_is_topic_already_exists(
    kafka_python: KafkaAdminClient, topic: str
) -> None:
    kafka_python.create_topics([KpNewTopic(topic, 1, 1)])
    with pytest.raises(kafka.errors.TopicAlreadyExistsError):
        kafka_python.create_topics([KpNewTopic(topic, 1, 1)])


def test_kafka_python_describe_cluster_reports_the_cluster_id_and_controller(
    kafka_python: KafkaAdminClient, cluster: RunningIcefloe
) -> None:
    described = kafka_python.describe_cluster()
    (broker,) = described["brokers"]
    assert broker["port"] == cluster.port
    assert described["controller_id"] == broker["broker_id"]
    assert described["cluster_id"]


# --- aiokafka --------------------------------------------------------------------------------


@pytest.fixture
async def aiokafka_admin(cluster: RunningIcefloe) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    yield admin
    await admin.close()


async def aio_configs(admin: AIOKafkaAdminClient, name: str) -> tuple[int, dict[str, str]]:
    """(error code, {name: value}) of a topic's DescribeConfigs result."""
    (response,) = await admin.describe_configs([AioConfigResource(AioResourceType.TOPIC, name)])
    (result,) = response.resources
    error_code, _message, _type, _name, entries = result[:5]
    return error_code, {entry[0]: entry[1] for entry in entries}


async def test_aiokafka_creates_a_topic(
    aiokafka_admin: AIOKafkaAdminClient, confluent: AdminClient, topic: str
) -> None:
    response = await aiokafka_admin.create_topics([AioNewTopic(topic, 2, 1)])
    assert [error for _name, error, *_ in response.topic_errors] == [0]
    assert partition_count(confluent, topic) == 2


async def test_aiokafka_describes_topic_configs(
    aiokafka_admin: AIOKafkaAdminClient, topic: str
) -> None:
    await aiokafka_admin.create_topics(
        [AioNewTopic(topic, 1, 1, topic_configs={"retention.ms": "1000"})]
    )
    error_code, configs = await aio_configs(aiokafka_admin, topic)
    assert error_code == 0
    assert configs["retention.ms"] == "1000"
    assert configs["cleanup.policy"] == "delete"


async def test_aiokafka_alter_configs_replaces_the_whole_set(
    aiokafka_admin: AIOKafkaAdminClient, topic: str
) -> None:
    await aiokafka_admin.create_topics(
        [AioNewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})]
    )
    resource = AioConfigResource(AioResourceType.TOPIC, topic, configs={"retention.ms": "7"})
    await aiokafka_admin.alter_configs([resource])
    _, configs = await aio_configs(aiokafka_admin, topic)
    assert (configs["retention.ms"], configs["cleanup.policy"]) == ("7", "delete")


async def test_aiokafka_creates_partitions(
    aiokafka_admin: AIOKafkaAdminClient, confluent: AdminClient, topic: str
) -> None:
    await aiokafka_admin.create_topics([AioNewTopic(topic, 1, 1)])
    await aiokafka_admin.create_partitions({topic: AioNewPartitions(5)})
    assert partition_count(confluent, topic) == 5


async def test_aiokafka_deletes_a_topic(
    aiokafka_admin: AIOKafkaAdminClient, confluent: AdminClient, topic: str
) -> None:
    await aiokafka_admin.create_topics([AioNewTopic(topic, 1, 1)])
    response = await aiokafka_admin.delete_topics([topic])
    assert [error for _name, error, *_ in response.topic_error_codes] == [0]
    assert topic not in confluent.list_topics(timeout=TIMEOUT).topics


async def test_aiokafka_existing_topic_is_topic_already_exists(
    aiokafka_admin: AIOKafkaAdminClient, topic: str
) -> None:
    await aiokafka_admin.create_topics([AioNewTopic(topic, 1, 1)])
    response = await aiokafka_admin.create_topics([AioNewTopic(topic, 1, 1)])
    assert [error for _name, error, *_ in response.topic_errors] == [
        ErrorCode.topic_already_exists.value
    ]


async def test_aiokafka_bad_config_value_is_invalid_config(
    aiokafka_admin: AIOKafkaAdminClient, topic: str
) -> None:
    bad = AioNewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "archive"})
    response = await aiokafka_admin.create_topics([bad])
    assert [error for _name, error, *_ in response.topic_errors] == [ErrorCode.invalid_config.value]


async def test_aiokafka_describing_an_unknown_topic_is_unknown_topic(
    aiokafka_admin: AIOKafkaAdminClient,
) -> None:
    error_code, configs = await aio_configs(aiokafka_admin, "never-created")
    assert (error_code, configs) == (ErrorCode.unknown_topic_or_partition.value, {})


# --- requests no admin client sends ----------------------------------------------------------


def create_request(*topics: Any, version: int = 7, validate_only: bool = False) -> Any:
    schema = admin_wire.module(19, version)
    return schema.CreateTopicsRequest(
        topics=tuple(topics), timeout=_TIMEDELTA, validate_only=validate_only
    )


def creatable(
    name: str, partitions: int = 1, replication: int = -1, assignments: tuple[Any, ...] = ()
) -> Any:
    return admin_wire.module(19, 7).CreatableTopic(
        name=name,
        num_partitions=partitions,
        replication_factor=replication,
        assignments=assignments,
        configs=(),
    )


def test_a_topic_named_twice_is_invalid_request_and_not_created(
    cluster: RunningIcefloe, confluent: AdminClient, topic: str
) -> None:
    response = admin_wire.call(
        cluster.bootstrap, create_request(creatable(topic), creatable(topic))
    )
    assert [(t.name, t.error_code) for t in response.topics] == [(topic, ErrorCode.invalid_request)]
    assert topic not in confluent.list_topics(timeout=TIMEOUT).topics


def test_replication_factor_zero_is_invalid_replication_factor(
    cluster: RunningIcefloe, topic: str
) -> None:
    response = admin_wire.call(cluster.bootstrap, create_request(creatable(topic, replication=0)))
    assert response.topics[0].error_code == ErrorCode.invalid_replication_factor


def test_a_manual_assignment_is_honoured_by_its_partition_count(
    cluster: RunningIcefloe, confluent: AdminClient, topic: str
) -> None:
    schema = admin_wire.module(19, 7)
    assignments = tuple(
        schema.CreatableReplicaAssignment(partition_index=i, broker_ids=(1,)) for i in range(3)
    )
    request = create_request(creatable(topic, partitions=-1, assignments=assignments))
    response = admin_wire.call(cluster.bootstrap, request)
    assert (response.topics[0].error_code, response.topics[0].num_partitions) == (
        ErrorCode.none,
        3,
    )
    assert partition_count(confluent, topic) == 3


def test_describe_configs_v4_gives_documentation_when_asked(
    cluster: RunningIcefloe, confluent: AdminClient, topic: str
) -> None:
    done(confluent.create_topics([NewTopic(topic, 1, 1)]))
    schema = admin_wire.module(32, 4)
    request = schema.DescribeConfigsRequest(
        resources=(
            schema.DescribeConfigsResource(
                resource_type=2, resource_name=topic, configuration_keys=("segment.bytes",)
            ),
        ),
        include_synonyms=False,
        include_documentation=True,
    )
    (result,) = admin_wire.call(cluster.bootstrap, request).results
    (entry,) = result.configs
    assert entry.config_type == 3  # INT
    assert entry.documentation is not None
    assert "no effect" in entry.documentation


def test_describe_cluster_for_controllers_is_mismatched_endpoint_type(
    cluster: RunningIcefloe,
) -> None:
    schema = admin_wire.module(60, 1)
    request = schema.DescribeClusterRequest(
        include_cluster_authorized_operations=False, endpoint_type=2
    )
    response = admin_wire.call(cluster.bootstrap, request)
    assert response.error_code == ErrorCode.mismatched_endpoint_type


def test_a_topic_created_with_the_cli_is_visible_to_the_running_broker(
    cluster: RunningIcefloe, confluent: AdminClient, topic: str
) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    cli = [sys.executable, "-m", "icefloe", "topics", "--data-dir", str(cluster.data_dir)]
    subprocess.run(
        [*cli, "create", topic, "--partitions", "2"],
        check=True,
        capture_output=True,
        env=environment,
    )
    assert partition_count(confluent, topic) == 2


# --- several brokers -------------------------------------------------------------------------


@pytest.fixture
def two_brokers(tmp_path: Path) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path / "data", brokers=2)
    yield running
    running.stop()


@pytest.fixture
def two_zones(tmp_path: Path) -> Iterator[tuple[RunningIcefloe, RunningIcefloe]]:
    """Two `icefloe serve` runs sharing one data directory, in zones z1 and z2."""
    z1 = start_icefloe(tmp_path / "data", env={"ICEFLOE_BROKER__ZONE": "z1"})
    z2 = start_icefloe(tmp_path / "data", env={"ICEFLOE_BROKER__ZONE": "z2"})
    yield z1, z2
    z2.stop()
    z1.stop()


def metadata_topic(address: str, name: str) -> Any:
    schema = admin_wire.module(3, 12)
    request = schema.MetadataRequest(
        topics=(schema.MetadataRequestTopic(name=name, topic_id=None),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return admin_wire.call(address, request).topics[0]


@pytest.mark.parametrize("asked", [True, False])
def test_metadata_v10_answers_the_clusters_operations_when_asked(
    cluster: RunningIcefloe, asked: bool
) -> None:
    schema = admin_wire.module(3, 10)  # v8-v10 carry them; later versions moved them away
    request = schema.MetadataRequest(
        topics=(),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=asked,
        include_topic_authorized_operations=False,
    )
    operations = admin_wire.call(cluster.bootstrap, request).cluster_authorized_operations
    if asked:  # no authorizer: every cluster operation is allowed
        assert operations > 0
    else:
        assert operations == -(2**31)  # Kafka's "not provided"


def test_a_topic_created_through_one_broker_is_at_once_visible_through_the_other(
    two_brokers: RunningIcefloe, topic: str
) -> None:
    first, second = (two_brokers.broker_address(i) for i in range(2))
    created = admin_wire.call(first, create_request(creatable(topic, partitions=3)))
    assert created.topics[0].error_code == ErrorCode.none
    seen = metadata_topic(second, topic)
    assert (seen.error_code, len(seen.partitions)) == (ErrorCode.none, 3)


def test_describe_cluster_lists_the_brokers_of_the_clients_zone(
    two_zones: tuple[RunningIcefloe, RunningIcefloe],
) -> None:
    z1, z2 = two_zones
    request = admin_wire.module(60, 1).DescribeClusterRequest(
        include_cluster_authorized_operations=False
    )
    # Membership reaches other brokers by notification: allow it a moment to arrive.
    deadline = time.monotonic() + 10
    while True:
        response = admin_wire.call(z1.bootstrap, request, client_id="app,zone_id=z2")
        brokers = [(b.port, b.rack) for b in response.brokers]
        if brokers == [(z2.port, "z2")] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert brokers == [(z2.port, "z2")]
