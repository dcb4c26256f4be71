"""Listeners of `icefloe serve` that would share a port are named before any broker starts."""

from __future__ import annotations

import pytest

from icefloe.broker.port_plan import port_clash
from icefloe.config import Config, load_config


def config(**env: str) -> Config:
    return load_config(env={"ICEFLOE_BROKER__PORT": "9092", **env})


def test_the_default_ports_do_not_clash_for_a_few_brokers() -> None:
    assert port_clash(config(), 4) is None


def test_a_listener_on_the_main_port_is_named_with_both_settings() -> None:
    clash = port_clash(config(ICEFLOE_SECURITY__LISTENERS="['SASL_PLAINTEXT://127.0.0.1:9092']"), 1)
    assert clash == (
        "[broker] port and [security] listeners SASL_PLAINTEXT://127.0.0.1:9092 would both "
        "listen on port 9092: give each its own port"
    )


def test_ports_too_close_for_the_number_of_brokers_clash_and_further_apart_do_not() -> None:
    env = {"ICEFLOE_SECURITY__LISTENERS": "['SASL_PLAINTEXT://127.0.0.1:9094']"}
    assert port_clash(config(**env), 2) is None
    clash = port_clash(config(**env), 3)
    assert clash is not None
    assert "[security] listeners SASL_PLAINTEXT://127.0.0.1:9094 (broker 0)" in clash
    assert "[broker] port (broker 2) would both listen on port 9094" in clash


@pytest.mark.parametrize(
    ("setting", "port"),
    [("ICEFLOE_METRICS__PORT", "9093"), ("ICEFLOE_SCHEMA_REGISTRY__PORT", "9093")],
)
def test_http_endpoints_clash_with_kafka_listeners(setting: str, port: str) -> None:
    assert port_clash(config(**{setting: port}), 1) is None
    assert "would both listen on port 9093" in (port_clash(config(**{setting: port}), 2) or "")


def test_endpoints_turned_off_or_on_chosen_ports_never_clash() -> None:
    assert (
        port_clash(config(ICEFLOE_METRICS__PORT="9092", ICEFLOE_METRICS__ENABLED="false"), 1)
        is None
    )
    assert port_clash(config(ICEFLOE_BROKER__PORT="0", ICEFLOE_METRICS__PORT="0"), 3) is None


def test_listeners_on_different_addresses_may_share_a_port_unless_one_is_every_address() -> None:
    apart = "['SASL_PLAINTEXT://10.0.0.2:9092']"
    assert port_clash(config(ICEFLOE_SECURITY__LISTENERS=apart), 1) is None
    everywhere = "['SASL_PLAINTEXT://0.0.0.0:9092']"
    advertised = "['SASL_PLAINTEXT://broker.example.com:9092']"
    clash = port_clash(
        config(
            ICEFLOE_SECURITY__LISTENERS=everywhere,
            ICEFLOE_SECURITY__ADVERTISED_LISTENERS=advertised,
        ),
        1,
    )
    assert clash is not None


def test_two_listeners_on_one_other_address_clash_though_the_main_port_is_elsewhere() -> None:
    clash = port_clash(
        config(
            ICEFLOE_BROKER__HOST="127.0.0.1",
            ICEFLOE_SECURITY__LISTENERS="['SASL_PLAINTEXT://10.0.0.2:9092']",
            ICEFLOE_METRICS__HOST="10.0.0.2",
            ICEFLOE_METRICS__PORT="9092",
        ),
        1,
    )
    assert clash == (
        "[security] listeners SASL_PLAINTEXT://10.0.0.2:9092 and [metrics] port would both "
        "listen on port 9092: give each its own port"
    )
