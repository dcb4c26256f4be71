"""Hostile frames of every advertised API cannot kill, freeze or corrupt a broker.

A seeded, bounded run of the network fuzzer (``tests/support/fuzz.py``) against `icefloe
serve`: mutated and well-formed requests of every API and version, lying lengths, truncations,
corrupt record batches and noise, over several pipelining connections. Meanwhile a bystander
asks for metadata every 50 ms. Afterwards: no broker died, the bystander was always answered
within a second, no handler failed (a traceback in the log would say so), and the records of
a topic the fuzzer never names are exactly what they were.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import trustme
from confluent_kafka.admin import AdminClient

from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe, unhandled_errors
from tests.support.fuzz import FrameSource, fuzz
from tests.support.kafka_wire import KafkaWire, batch_of, produce_request
from tests.support.servers import free_port
from tests.support.topics import create_topic, stored_records

SEED = 20261123
FRAMES = 12_000
PRECIOUS = "precious"
"""Read by the bystander, never named by the fuzzer: its records must not change."""
PLAYGROUND = ("fuzz-a", "fuzz-b")
NAMES = (*PLAYGROUND, "fuzz-group", "fuzz-txn", "consumer", "range", "uniform")


def test_fuzzed_frames_leave_the_broker_up_responsive_and_its_data_intact(
    tmp_path: Path,
) -> None:
    running = start_icefloe(tmp_path / "data")
    try:
        for topic in (PRECIOUS, *PLAYGROUND):
            create_topic(running, topic, 3)
        with KafkaWire(running.bootstrap) as wire:
            for partition in range(3):
                batch = batch_of([b"keep %d" % i for i in range(5)])
                wire.request(produce_request(PRECIOUS, partition, batch))
        before = [stored_records(running, PRECIOUS, p) for p in range(3)]
        brokers = broker_pids(running)

        frames = FrameSource(SEED, NAMES, PLAYGROUND)
        report = asyncio.run(
            fuzz("127.0.0.1", running.port, frames, count=FRAMES, bystander_topic=PRECIOUS)
        )

        assert report.bystander_failures == []
        assert report.bystander_max_s < 1.0, f"bystander waited {report.bystander_max_s:.2f} s"
        assert report.handled > FRAMES // 4, f"only {report.handled} frames reached the broker"
        assert broker_pids(running) == brokers, "a broker died and was restarted"
        assert [stored_records(running, PRECIOUS, p) for p in range(3)] == before
    finally:
        running.stop()
    errors = unhandled_errors(running.log_path.read_text(errors="replace"))
    assert not errors, errors[0]


def test_before_the_login_a_tls_sasl_listener_lets_fuzzed_frames_do_nothing(
    tmp_path: Path,
) -> None:
    authority = trustme.CA()
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "server.pem")
    )
    client_tls = ssl.create_default_context()
    authority.configure_trust(client_tls)
    secured_port = free_port()
    running = start_icefloe(
        tmp_path / "data",
        env={
            "ICEFLOE_SECURITY__LISTENERS": f'["SASL_SSL://127.0.0.1:{secured_port}"]',
            "ICEFLOE_SECURITY__TLS__CERTFILE": str(tmp_path / "server.pem"),
        },
    )
    try:
        for topic in (PRECIOUS, *PLAYGROUND):
            create_topic(running, topic, 3)
        brokers = broker_pids(running)

        frames = FrameSource(SEED + 1, NAMES, PLAYGROUND)
        report = asyncio.run(
            fuzz(
                "127.0.0.1",
                running.port,
                frames,
                count=FRAMES // 4,
                bystander_topic=PRECIOUS,
                attack_port=secured_port,
                attack_tls=client_tls,
            )
        )

        assert report.bystander_failures == []
        assert report.bystander_max_s < 1.0, f"bystander waited {report.bystander_max_s:.2f} s"
        assert report.refused > 0
        assert broker_pids(running) == brokers, "a broker died and was restarted"
        # Unauthenticated bytes stored nothing, created nothing, joined nothing.
        for topic in PLAYGROUND:
            assert [stored_records(running, topic, p) for p in range(3)] == [[], [], []]
        assert topic_names(running) - {"__consumer_offsets"} == {PRECIOUS, *PLAYGROUND}
    finally:
        running.stop()
    errors = unhandled_errors(running.log_path.read_text(errors="replace"))
    assert not errors, errors[0]


def topic_names(running: RunningIcefloe) -> set[str]:
    admin = AdminClient({"bootstrap.servers": running.bootstrap})
    return set(admin.list_topics(timeout=10).topics)
