"""Zone-aware routing: clients see the brokers of their zone; any broker serves any partition."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.broker import RunningIcefloe, start_icefloe


def start_two_zones(data: Path) -> tuple[RunningIcefloe, RunningIcefloe]:
    """Two `icefloe serve` runs sharing one data directory, in zones z1 and z2."""
    z1 = start_icefloe(data, env={"ICEFLOE_BROKER__ZONE": "z1"})
    try:
        return z1, start_icefloe(data, env={"ICEFLOE_BROKER__ZONE": "z2"})
    except BaseException:
        z1.stop()
        raise


@pytest.fixture(scope="module")
def two_zones(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunningIcefloe, RunningIcefloe]]:
    """Both zones, for the tests that only ask for metadata."""
    z1, z2 = start_two_zones(tmp_path_factory.mktemp("zones") / "data")
    yield z1, z2
    z2.stop()
    z1.stop()


def broker_ports(bootstrap: str, client_id: str) -> set[int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": client_id})
    brokers = admin.list_topics(timeout=10).brokers.values()
    return {b.port for b in brokers}


def test_client_in_a_zone_sees_only_that_zones_brokers(
    two_zones: tuple[RunningIcefloe, RunningIcefloe],
) -> None:
    z1, z2 = two_zones
    assert broker_ports(z2.bootstrap, "app,zone_id=z1") == {z1.port}
    assert broker_ports(z1.bootstrap, "zone_id=z2,app") == {z2.port}


def test_client_without_a_zone_sees_every_broker(
    two_zones: tuple[RunningIcefloe, RunningIcefloe],
) -> None:
    z1, z2 = two_zones
    assert broker_ports(z1.bootstrap, "app") == {z1.port, z2.port}


def test_client_of_an_empty_zone_sees_every_broker(
    two_zones: tuple[RunningIcefloe, RunningIcefloe],
) -> None:
    z1, z2 = two_zones
    assert broker_ports(z1.bootstrap, "app,zone_id=z3") == {z1.port, z2.port}


def test_a_stopped_broker_leaves_the_metadata(tmp_path: Path) -> None:
    z1, z2 = start_two_zones(tmp_path / "data")
    try:
        assert z2.stop() == 0  # a clean exit on SIGTERM
        # Membership reaches other brokers by notification: allow it a moment to arrive.
        deadline = time.monotonic() + 10
        while broker_ports(z1.bootstrap, "app") != {z1.port}:
            assert time.monotonic() < deadline, "the stopped broker is still listed"
            time.sleep(0.1)
    finally:
        z2.stop()
        z1.stop()
