"""The ports ``icefloe serve`` will listen on, checked against each other before any opens.

Every listener of the first broker has a configured port, and broker ``i`` adds ``i`` to each.
Two of them on one port would fail at start with "port in use", naming a port the operator may
not recognise as taken by the same configuration; the clash is named here instead, with the
two settings that cause it.
"""

from __future__ import annotations

from dataclasses import dataclass

from icefloe.config import Config

_EVERY_ADDRESS = frozenset(("", "0.0.0.0", "::"))


@dataclass(frozen=True, slots=True)
class _Listener:
    setting: str
    """The configuration key that sets its port."""
    host: str
    port: int


def port_clash(config: Config, brokers: int) -> str | None:
    """A one-line message naming two listeners of the ``brokers`` brokers that would share a
    port, or ``None``. Ports of 0 (chosen at start) never clash."""
    first = _first_broker_listeners(config)
    seen: dict[int, list[tuple[_Listener, int]]] = {}
    for index in range(brokers):
        for listener in first:
            port = listener.port + index
            on_port = seen.setdefault(port, [])
            for other in on_port:
                if _same_address(other[0].host, listener.host):
                    return _message(other, (listener, index), port, brokers)
            on_port.append((listener, index))
    return None


def _first_broker_listeners(config: Config) -> list[_Listener]:
    host = config.broker.host
    listeners = [_Listener("[broker] port", host, config.broker.port)]
    for address in config.security.listener_addresses(host, config.broker.port)[1:]:
        listeners.append(_Listener(f"[security] listeners {address}", address.host, address.port))
    if config.metrics.enabled:
        metrics_host = config.metrics.host or host
        listeners.append(_Listener("[metrics] port", metrics_host, config.metrics.port))
    if config.schema_registry.served:
        registry_host = config.schema_registry.host or host
        listeners.append(
            _Listener("[schema_registry] port", registry_host, config.schema_registry.port)
        )
    return [listener for listener in listeners if listener.port]


def _same_address(a: str, b: str) -> bool:
    return a == b or a in _EVERY_ADDRESS or b in _EVERY_ADDRESS


def _message(
    first: tuple[_Listener, int], second: tuple[_Listener, int], port: int, brokers: int
) -> str:
    if brokers == 1:
        return (
            f"{first[0].setting} and {second[0].setting} would both listen on port {port}: "
            "give each its own port"
        )
    return (
        f"{first[0].setting} (broker {first[1]}) and {second[0].setting} (broker {second[1]}) "
        f"would both listen on port {port}: each of the {brokers} brokers adds its index to "
        "every port, so give them ports at least that far apart"
    )
