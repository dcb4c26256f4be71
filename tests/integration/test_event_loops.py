"""Both event loops a broker can run on (``[broker] event_loop``) serve real clients: records
small and large round-trip over a plaintext and a TLS listener, on asyncio's loop and on
uvloop, and the broker says which loop it runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.servers import free_port
from tests.support.topics import create_topic

VALUE_SIZES = [0, 1, 100, 20_000, 900_000, 7]
"""Empty to near the default message limit: large ones are received straight into their own
buffers, the rest through the read-ahead buffer."""


@dataclass
class Served:
    icefloe: RunningIcefloe
    tls_address: str
    ca: Path


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp(f"loop-{request.param}")
    authority = trustme.CA()
    authority.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(folder / "server.pem")
    )
    authority.cert_pem.write_to_path(str(folder / "ca.pem"))
    tls_port = free_port()
    running = start_icefloe(
        folder / "data",
        env={
            "ICEFLOE_BROKER__EVENT_LOOP": request.param,
            "ICEFLOE_SECURITY__LISTENERS": f'["SSL://127.0.0.1:{tls_port}"]',
            "ICEFLOE_SECURITY__TLS__CERTFILE": str(folder / "server.pem"),
        },
    )
    try:
        assert f"(event loop: {request.param})" in running.log_path.read_text()
        create_topic(running, "loops", 2)
        yield Served(running, f"127.0.0.1:{tls_port}", folder / "ca.pem")
    finally:
        running.stop()


@pytest.mark.parametrize("listener", ["PLAINTEXT", "SSL"])
def test_records_of_every_size_round_trip(served: Served, listener: str) -> None:
    config = {"bootstrap.servers": served.icefloe.bootstrap}
    if listener == "SSL":
        config = {
            "bootstrap.servers": served.tls_address,
            "security.protocol": "SSL",
            "ssl.ca.location": str(served.ca),
        }
    values = [os.urandom(size) for size in VALUE_SIZES]
    producer = Producer({**config, "acks": "all", "linger.ms": 5})
    offsets: list[int] = []
    for value in values:
        producer.produce(
            "loops",
            value,
            partition=0,
            on_delivery=lambda _err, m: offsets.append(m.offset()),
        )
    assert producer.flush(30) == 0
    assert len(offsets) == len(values)

    consumer = Consumer({**config, "group.id": "loops", "enable.auto.commit": False})
    consumer.assign([TopicPartition("loops", 0, min(offsets))])
    got: list[bytes] = []
    while len(got) < len(values):
        message = consumer.poll(30)
        assert message is not None, f"{len(got)} of {len(values)} records read"
        assert message.error() is None
        got.append(message.value() or b"")
    consumer.close()
    assert got == values
