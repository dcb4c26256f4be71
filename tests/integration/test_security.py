"""TLS and SASL through real clients: confluent-kafka, kafka-python and aiokafka log in with
SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN over TLS listeners (and without TLS), produce and read;
wrong passwords and unknown users are refused with SASL_AUTHENTICATION_FAILED; nothing but the
login is served before it; users are managed with `icefloe users` and the Admin API."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.kafka_jvm import CONFIGS, TOPICS, run_java
from tests.support.servers import free_port, free_ports

PASSWORD = "correct horse battery staple"


@dataclass
class Secured:
    icefloe: RunningIcefloe
    ca: Path
    client_cert: Path
    ports: dict[str, int]
    """Port of each listener, by protocol."""

    def address(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol]}"


def icefloe_users(
    data: Path, *args: str, password: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "icefloe", "users", *args, "--data-dir", str(data)],
        input=None if password is None else password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")},
    )


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("security")
    authority = trustme.CA()
    server = authority.issue_cert("127.0.0.1", "localhost")
    server.private_key_and_cert_chain_pem.write_to_path(str(folder / "server.pem"))
    authority.cert_pem.write_to_path(str(folder / "ca.pem"))
    client = authority.issue_cert("client@example.com")
    client.private_key_and_cert_chain_pem.write_to_path(str(folder / "client.pem"))
    data = folder / "data"
    added = icefloe_users(data, "add", "alice", "--password-stdin", password=PASSWORD)
    assert added.returncode == 0, added.stderr
    ports = dict(zip(("SASL_SSL", "SASL_PLAINTEXT", "SSL"), free_ports(3), strict=True))
    running = start_icefloe(
        data,
        env={
            "ICEFLOE_SECURITY__LISTENERS": repr([f"{p}://127.0.0.1:{n}" for p, n in ports.items()]),
            "ICEFLOE_SECURITY__TLS__CERTFILE": str(folder / "server.pem"),
            "ICEFLOE_SECURITY__TLS__CAFILE": str(folder / "ca.pem"),
            "ICEFLOE_SECURITY__TLS__CLIENT_AUTH": "requested",
            "ICEFLOE_SECURITY__FAILED_AUTHENTICATION_DELAY_MS": "10",
        },
    )
    try:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic("secure", 1)])["secure"].result(30)
        yield Secured(running, folder / "ca.pem", folder / "client.pem", ports)
    finally:
        running.stop()


def confluent_config(
    secured: Secured, protocol: str, mechanism: str, password: str
) -> dict[str, str]:
    config = {
        "bootstrap.servers": secured.address(protocol),
        "security.protocol": protocol,
        "sasl.mechanisms": mechanism,
        "sasl.username": "alice",
        "sasl.password": password,
    }
    if protocol == "SASL_SSL":
        config["ssl.ca.location"] = str(secured.ca)
    return config


def round_trip(config: dict[str, str], value: bytes) -> None:
    """Produce ``value`` and read it back with ``config``'s connection settings."""
    producer = Producer(config)
    delivered: list[int] = []
    producer.produce("secure", value, on_delivery=lambda _e, m: delivered.append(m.offset()))
    assert producer.flush(30) == 0
    # Assigned, not subscribed: the login is the point here, not a group's join.
    consumer = Consumer({**config, "group.id": "readers", "enable.auto.commit": False})
    consumer.assign([TopicPartition("secure", 0, delivered[0])])
    message = consumer.poll(30)
    consumer.close()
    assert message is not None
    assert message.error() is None
    assert message.value() == value


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
@pytest.mark.parametrize("protocol", ["SASL_SSL", "SASL_PLAINTEXT"])
def test_confluent_kafka_logs_in_and_round_trips(
    secured: Secured, protocol: str, mechanism: str
) -> None:
    config = confluent_config(secured, protocol, mechanism, PASSWORD)
    round_trip(config, f"{protocol}/{mechanism}".encode())
    # Metadata answers this listener's addresses, so the client stayed on it.
    brokers = AdminClient(config).list_topics(timeout=10).brokers.values()
    assert {b.port for b in brokers} == {secured.ports[protocol]}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
@pytest.mark.parametrize("user_is_known", [True, False])
def test_confluent_kafka_wrong_credentials_are_refused(
    secured: Secured, mechanism: str, user_is_known: bool
) -> None:
    config = confluent_config(secured, "SASL_SSL", mechanism, "wrong password")
    if not user_is_known:
        config["sasl.username"] = "mallory"
    errors = []
    admin = AdminClient({**config, "error_cb": errors.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=2)
    admin.poll(1)  # librdkafka reports the broker's answer through the error callback
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert any("invalid credentials" in e.str() for e in errors), errors


def test_kafka_python_logs_in_with_scram_sha_512_over_tls(secured: Secured) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    settings = {
        "bootstrap_servers": secured.address("SASL_SSL"),
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
        "ssl_cafile": str(secured.ca),
    }
    producer = KafkaProducer(**settings, acks="all")
    sent = producer.send("secure", b"kafka-python").get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(**settings, consumer_timeout_ms=10_000)
    partition = TopicPartition("secure", 0)
    consumer.assign([partition])
    consumer.seek(partition, sent.offset)
    assert next(iter(consumer)).value == b"kafka-python"
    consumer.close()


def test_kafka_python_wrong_password_is_sasl_authentication_failed(
    secured: Secured, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    with (
        caplog.at_level(logging.WARNING, logger="kafka"),
        pytest.raises(KafkaTimeoutError),  # kafka-python's answer: it cannot bootstrap
    ):
        KafkaProducer(
            bootstrap_servers=secured.address("SASL_PLAINTEXT"),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256",
            sasl_plain_username="alice",
            sasl_plain_password="nope",
            bootstrap_timeout_ms=8000,
        )
    # ... because every bootstrap attempt was refused with the broker's error 58 (which it
    # reads before the broker closes the connection, never seeing only the close).
    assert "SaslAuthenticationFailedError" in caplog.text
    assert "invalid credentials" in caplog.text
    assert "socket disconnected" not in caplog.text


def test_aiokafka_logs_in_with_plain_over_tls(secured: Secured) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.helpers import create_ssl_context

    async def produce() -> int:
        producer = AIOKafkaProducer(
            bootstrap_servers=secured.address("SASL_SSL"),
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_plain_username="alice",
            sasl_plain_password=PASSWORD,
            ssl_context=create_ssl_context(cafile=str(secured.ca)),
        )
        await producer.start()
        try:
            sent = await producer.send_and_wait("secure", b"aiokafka")
            return sent.offset
        finally:
            await producer.stop()

    assert asyncio.run(produce()) >= 0


def test_a_client_certificate_is_enough_on_a_tls_listener(secured: Secured) -> None:
    round_trip(
        {
            "bootstrap.servers": secured.address("SSL"),
            "security.protocol": "SSL",
            "ssl.ca.location": str(secured.ca),
            "ssl.certificate.location": str(secured.client_cert),
            "ssl.key.location": str(secured.client_cert),
        },
        b"mutual tls",
    )


def test_nothing_but_the_login_is_served_before_it(secured: Secured) -> None:
    # Metadata v1 with no topics, as the first request on a SASL listener.
    body = struct.pack(">hhih", 3, 1, 7, -1) + struct.pack(">i", -1)
    with socket.create_connection(("127.0.0.1", secured.ports["SASL_PLAINTEXT"]), 10) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        s.settimeout(10)
        assert s.recv(4096) == b""  # closed without an answer
    # The plaintext listener stays open to anyone, as configured.
    with socket.create_connection(secured.icefloe.bootstrap.split(":"), 10) as s:  # type: ignore[arg-type]
        s.sendall(struct.pack(">i", len(body)) + body)
        s.settimeout(10)
        assert len(s.recv(4096)) > 4


def test_tls_listener_refuses_clients_that_do_not_speak_tls(secured: Secured) -> None:
    with socket.create_connection(("127.0.0.1", secured.ports["SASL_SSL"]), 10) as s:
        s.sendall(b"\x00\x00\x00\x10" + os.urandom(16))
        s.settimeout(15)
        try:
            answer = s.recv(4096)
        except ConnectionResetError:
            answer = b""
    assert not answer.startswith(b"\x00\x00")  # no Kafka answer: a TLS alert or a close
    context = ssl.create_default_context(cafile=str(secured.ca))
    with (
        socket.create_connection(("127.0.0.1", secured.ports["SASL_SSL"]), 10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_users_are_managed_over_the_admin_api_and_log_in_at_once(secured: Secured) -> None:
    admin = AdminClient({"bootstrap.servers": secured.icefloe.bootstrap})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    futures = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("bob", info, b"bobs password", b"a salt of 16 b..")]
    )
    futures["bob"].result(30)
    described = admin.describe_user_scram_credentials(["bob"])["bob"].result(30)
    assert [c.mechanism for c in described.scram_credential_infos] == [ScramMechanism.SCRAM_SHA_256]
    config = confluent_config(secured, "SASL_PLAINTEXT", "SCRAM-SHA-256", "bobs password")
    config["sasl.username"] = "bob"
    AdminClient(config).list_topics(timeout=10)

    admin.alter_user_scram_credentials(
        [UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)]
    )["bob"].result(30)
    with pytest.raises(KafkaException):
        AdminClient(config).list_topics(timeout=3)
    listed = icefloe_users(secured.icefloe.data_dir, "list")
    assert "alice" in listed.stdout
    assert "bob" not in listed.stdout


def test_unacceptable_credentials_are_refused_with_kafkas_error(secured: Secured) -> None:
    admin = AdminClient({"bootstrap.servers": secured.icefloe.bootstrap})
    weak = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 100)
    future = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("carol", weak, b"password", b"salt")]
    )["carol"]
    with pytest.raises(KafkaException, match="iterations must be between 4096 and 16384"):
        future.result(30)
    enough = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    future = admin.alter_user_scram_credentials(
        [UserScramCredentialUpsertion("carol", enough, b"password", b"salt")]
    )["carol"]
    with pytest.raises(KafkaException, match="at least 12 bytes"):
        future.result(30)
    assert "carol" not in icefloe_users(secured.icefloe.data_dir, "list").stdout


# --- the Java client, through Kafka 4.1's own tools -------------------------------------------


def java_client_config(secured: Secured, mechanism: str, password: str, path: Path) -> Path:
    module = (
        "org.apache.kafka.common.security.plain.PlainLoginModule"
        if mechanism == "PLAIN"
        else "org.apache.kafka.common.security.scram.ScramLoginModule"
    )
    path.write_text(
        "security.protocol=SASL_SSL\n"
        f"sasl.mechanism={mechanism}\n"
        f'sasl.jaas.config={module} required username="alice" password="{password}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={secured.ca}\n"
    )
    return path


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_the_java_client_produces_over_tls_with_each_mechanism(
    secured: Secured, mechanism: str, tmp_path: Path
) -> None:
    config = java_client_config(secured, mechanism, PASSWORD, tmp_path / "client.properties")
    done = run_java(
        "org.apache.kafka.tools.ProducerPerformance",
        *("--topic", "secure", "--num-records", "200", "--record-size", "100"),
        *("--throughput", "-1", "--producer.config", str(config)),
        *("--producer-props", f"bootstrap.servers={secured.address('SASL_SSL')}"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "200 records sent" in done.stdout


def test_the_java_client_is_refused_with_a_wrong_password(secured: Secured, tmp_path: Path) -> None:
    config = java_client_config(secured, "SCRAM-SHA-256", "wrong", tmp_path / "client.properties")
    done = run_java(
        TOPICS,
        *("--bootstrap-server", secured.address("SASL_SSL"), "--command-config", str(config)),
        "--list",
    )
    assert done.returncode != 0
    assert "SaslAuthenticationException" in done.stdout + done.stderr
    assert "invalid credentials" in done.stdout + done.stderr


def test_kafka_configs_adds_a_user_who_can_then_log_in(secured: Secured) -> None:
    done = run_java(
        CONFIGS,
        *("--bootstrap-server", secured.icefloe.bootstrap, "--alter"),
        *("--entity-type", "users", "--entity-name", "dave"),
        *("--add-config", "SCRAM-SHA-512=[iterations=8192,password=daves-secret]"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    config = confluent_config(secured, "SASL_SSL", "SCRAM-SHA-512", "daves-secret")
    config["sasl.username"] = "dave"
    AdminClient(config).list_topics(timeout=10)


# --- re-authentication (KIP-368) -------------------------------------------------------------


def test_logins_are_renewed_and_a_deleted_user_is_cut_off(tmp_path: Path) -> None:
    data = tmp_path / "data"
    added = icefloe_users(data, "add", "erin", "--password-stdin", password=PASSWORD)
    assert added.returncode == 0, added.stderr
    port = free_port()
    running = start_icefloe(
        data,
        env={
            "ICEFLOE_SECURITY__LISTENERS": f'["SASL_PLAINTEXT://127.0.0.1:{port}"]',
            "ICEFLOE_SECURITY__CONNECTIONS_MAX_REAUTH_MS": "1500",
        },
    )
    try:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic("renewed", 1)])["renewed"].result(30)
        errors: list[KafkaError] = []
        producer = Producer(
            {
                "bootstrap.servers": f"127.0.0.1:{port}",
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanisms": "SCRAM-SHA-256",
                "sasl.username": "erin",
                "sasl.password": PASSWORD,
                "error_cb": errors.append,
            }
        )
        # Six seconds on one connection: the login is renewed several times, unnoticed.
        for i in range(12):
            producer.produce("renewed", b"%d" % i)
            assert producer.flush(10) == 0
            time.sleep(0.5)
        assert errors == []
        renewals = logins_per_connection(running, "erin")
        assert max(renewals.values()) >= 3, f"logins per connection in 6 s: {renewals}"

        deleted = icefloe_users(data, "delete", "erin")
        assert deleted.returncode == 0, deleted.stderr
        deadline = time.monotonic() + 15
        while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
            assert time.monotonic() < deadline, "a deleted user stayed connected"
            producer.poll(0.5)
    finally:
        running.stop()


def logins_per_connection(running: RunningIcefloe, user: str) -> dict[str, int]:
    """How often each connection (by the peer address the broker logs) logged in as ``user``."""
    counts: dict[str, int] = {}
    for line in running.log_path.read_text().splitlines():
        peer, found, _ = line.partition(f" logged in as {user} ")
        if found:
            counts[peer.rsplit("] ", 1)[-1]] = counts.get(peer.rsplit("] ", 1)[-1], 0) + 1
    return counts


def test_the_schema_registry_asks_sasl_users_for_their_password(secured: Secured) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError

    url = secured.icefloe.registry_urls[0]
    logged_in = SchemaRegistryClient({"url": url, "basic.auth.user.info": f"alice:{PASSWORD}"})
    assert logged_in.register_schema("secure-value", Schema('"string"', "AVRO")) > 0
    for conf in ({"url": url}, {"url": url, "basic.auth.user.info": "alice:wrong"}):
        with pytest.raises(SchemaRegistryError) as refused:
            SchemaRegistryClient(conf).get_subjects()
        assert refused.value.http_status_code == 401
