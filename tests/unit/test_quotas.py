"""Client quotas: Kafka's rate and throttle arithmetic, the eight levels of precedence, the
filters of DescribeClientQuotas, the checks of AlterClientQuotas, and the store every broker
caches."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from icefloe.broker.quotas import QuotaManager, Rate, ident, throttle_ms
from icefloe.config.quotas import QuotaOptions
from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
from icefloe.keyspace import QUOTAS
from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import MetadataStore
from icefloe.security.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    QuotaError,
    QuotaFilter,
    QuotaStore,
    entity,
    entity_of,
    validated_entity,
    validated_value,
)
from tests.support.waiting import eventually

N, WINDOW = 11, 1.0  # Kafka's defaults: 11 samples of a second


# --- the rate and the throttle time ---------------------------------------------------------


def test_a_first_burst_is_spread_over_ten_whole_windows() -> None:
    rate = Rate()
    rate.record(1000, 0.0, N, WINDOW)
    assert rate.window_size(0.0, N, WINDOW) == pytest.approx(10.0)
    assert rate.measure(0.0, N, WINDOW) == pytest.approx(100.0)
    # Within the first second the period grows with it; at a whole second it is ten again.
    assert rate.window_size(0.5, N, WINDOW) == pytest.approx(10.5)
    assert rate.window_size(3.0, N, WINDOW) == pytest.approx(10.0)


def test_throttle_time_brings_the_rate_back_to_the_quota() -> None:
    # Kafka's ClientQuotaManager: observed 100 over a quota of 50 with a 10 s period
    # needs (100 - 50) / 50 * 10 s.
    rate = Rate()
    rate.record(1000, 0.0, N, WINDOW)
    assert throttle_ms(rate, 50.0, 0.0, N, WINDOW) == 10_000
    assert throttle_ms(rate, 100.0, 0.0, N, WINDOW) == 0  # at the quota is within it
    # After the throttle the rate, measured over the longer period, is the quota.
    later = Rate()
    later.record(1000, 0.0, N, WINDOW)
    assert later.measure(10.0, N, WINDOW) == pytest.approx(100.0)  # 1000 over 10 s
    assert later.measure(10.0, N, WINDOW) < 100.0 + 1e-9


def test_the_request_quota_throttle_is_capped_at_one_window() -> None:
    rate = Rate()
    rate.record(10_000, 0.0, N, WINDOW)
    assert throttle_ms(rate, 50.0, 0.0, N, WINDOW) > 100_000
    assert throttle_ms(rate, 50.0, 0.0, N, WINDOW, cap_ms=WINDOW * 1000) == 1000


def test_samples_idle_for_the_whole_period_are_forgotten() -> None:
    rate = Rate()
    rate.record(5000, 0.0, N, WINDOW)
    assert rate.measure(10.9, N, WINDOW) > 0
    assert rate.measure(11.0, N, WINDOW) == 0.0


def test_a_steady_rate_is_measured_as_such() -> None:
    rate = Rate()
    t = 0.0
    while t < 30.0:
        rate.record(100.0, t, N, WINDOW)  # 1000 per second
        t += 0.1
    assert rate.measure(t, N, WINDOW) == pytest.approx(1000.0, rel=0.05)


def test_a_client_that_always_waits_its_throttle_time_keeps_to_its_quota() -> None:
    # Small requests, a client much faster than its quota that waits each throttle time out:
    # after Kafka's first allowance the long-run rate is the quota.
    quota, size, t = 10_000.0, 500.0, 0.0
    rate = Rate()
    sent: list[tuple[float, float]] = []
    while t < 120.0:
        rate.record(size, t, N, WINDOW)
        sent.append((t, size))
        t += 0.001 + throttle_ms(rate, quota, t, N, WINDOW) / 1000
    achieved = sum(s for at, s in sent if 20.0 <= at < 108.0) / 88.0  # eight whole periods
    assert achieved == pytest.approx(quota, rel=0.10)


def test_a_taken_back_value_leaves_the_rate_as_it_was() -> None:
    rate = Rate()
    rate.record(300, 0.0, N, WINDOW)
    before = rate.measure(0.5, N, WINDOW)
    rate.record(700, 0.5, N, WINDOW)
    rate.record(-700, 0.5, N, WINDOW)
    assert rate.measure(0.5, N, WINDOW) == pytest.approx(before)


def test_long_names_are_tracked_by_a_digest() -> None:
    assert ident("app") == "app"
    long = "x" * 10_000
    assert isinstance(ident(long), bytes)
    assert len(ident(long)) == 16
    assert ident(long) == ident("x" * 10_000) != ident("x" * 10_001)


# --- precedence -------------------------------------------------------------------------------


class FakeStore(QuotaStore):
    """A cache filled by hand."""

    def __init__(self, quotas: dict[tuple[tuple[str, str | None], ...], dict[str, float]]) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        for found, values in quotas.items():
            self._remember(found, values)


LEVELS = [
    (entity(user="alice", client_id="app"), ("alice", "app")),
    (entity(user="alice", client_id=None), ("alice", "app")),
    (entity(user="alice"), ("alice", "")),
    (entity(user=None, client_id="app"), ("alice", "app")),
    (entity(user=None, client_id=None), ("alice", "app")),
    (entity(user=None), ("alice", "")),
    (entity(client_id="app"), ("", "app")),
    (entity(client_id=None), ("", "app")),
]
"""Kafka's eight levels, most specific first, with the usage each measures for alice/app."""


@pytest.mark.parametrize("winner", range(len(LEVELS)))
def test_the_most_specific_level_that_sets_a_key_wins(winner: int) -> None:
    # Every level from the winner down sets the key: the winner's value applies.
    store = FakeStore(
        {level: {PRODUCER_BYTE_RATE: 1000.0 + i} for i, (level, _) in enumerate(LEVELS[winner:])}
    )
    found = store.limit("alice", "app", PRODUCER_BYTE_RATE)
    assert found == (1000.0, LEVELS[winner][1])


def test_each_key_is_looked_up_on_its_own() -> None:
    store = FakeStore(
        {
            entity(user="alice", client_id="app"): {REQUEST_PERCENTAGE: 50.0},
            entity(client_id=None): {PRODUCER_BYTE_RATE: 2048.0},
        }
    )
    assert store.limit("alice", "app", REQUEST_PERCENTAGE) == (50.0, ("alice", "app"))
    assert store.limit("alice", "app", PRODUCER_BYTE_RATE) == (2048.0, ("", "app"))
    assert store.limit("alice", "app", CONSUMER_BYTE_RATE) is None


def test_other_users_and_client_ids_do_not_match_named_entities() -> None:
    store = FakeStore(
        {
            entity(user="alice", client_id="app"): {PRODUCER_BYTE_RATE: 1.0},
            entity(user="alice"): {PRODUCER_BYTE_RATE: 2.0},
            entity(client_id="app"): {PRODUCER_BYTE_RATE: 3.0},
        }
    )
    assert store.limit("bob", "other", PRODUCER_BYTE_RATE) is None
    assert store.limit("bob", "app", PRODUCER_BYTE_RATE) == (3.0, ("", "app"))
    assert store.limit("alice", "other", PRODUCER_BYTE_RATE) == (2.0, ("alice", ""))


def test_a_user_quota_is_shared_by_its_client_ids_and_a_default_is_per_client() -> None:
    store = FakeStore(
        {
            entity(user="alice"): {PRODUCER_BYTE_RATE: 100.0},
            entity(client_id=None): {PRODUCER_BYTE_RATE: 100.0},
        }
    )
    manager = QuotaManager(store, QuotaOptions(), clock=lambda: 0.0)
    one, two = manager.limits("alice", "a"), manager.limits("alice", "b")
    assert one.produce is not None
    assert two.produce is not None
    assert one.produce[1] == two.produce[1]  # one rate for all of alice's clients
    bob_a, bob_b = manager.limits("bob", "a"), manager.limits("bob", "b")
    assert bob_a.produce is not None
    assert bob_b.produce is not None
    assert bob_a.produce[1] != bob_b.produce[1]  # the default: a rate per client id


def test_tracked_state_stays_bounded_when_client_ids_keep_changing() -> None:
    store = FakeStore({entity(client_id=None): {PRODUCER_BYTE_RATE: 100.0}})
    manager = QuotaManager(store, QuotaOptions(max_tracked=50), clock=lambda: 0.0)
    for i in range(5000):
        limits = manager.limits("ANONYMOUS", f"rotating-{i}" + "x" * 500)
        assert limits.produce is not None
        manager.record(limits.produce, 10.0, float(i))
    assert manager.tracked == 50
    assert len(manager._limits) == 50


def test_a_change_of_quotas_reaches_cached_limits() -> None:
    store = FakeStore({entity(client_id="app"): {PRODUCER_BYTE_RATE: 100.0}})
    manager = QuotaManager(store, QuotaOptions(), clock=lambda: 0.0)
    assert manager.limits("u", "app").produce is not None
    store._remember(entity(client_id="app"), {})
    assert manager.limits("u", "app").produce is None
    assert not store.configured


# --- what AlterClientQuotas and DescribeClientQuotas accept ----------------------------------


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ([], "Invalid empty client quota entity"),
        ([(USER, "a"), (USER, "b")], "Invalid client quota entity, duplicate entity entry user"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        ([(CLIENT_ID, "")], "Empty client-id not supported"),
        ([("ip", "10.0.0.1")], "ip quotas"),
        ([(USER, "é" * 200)], "too long to store"),
    ],
)
def test_entities_kafka_refuses_are_refused(
    parts: list[tuple[str, str | None]], message: str
) -> None:
    with pytest.raises(QuotaError, match=message):
        validated_entity(parts)


def test_entities_are_kept_in_one_order() -> None:
    assert validated_entity([(USER, "a"), (CLIENT_ID, None)]) == entity(user="a", client_id=None)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("producer_byte_rat", 10.0, "Invalid configuration key producer_byte_rat"),
        (PRODUCER_BYTE_RATE, 0.0, "must be greater than 0"),
        (PRODUCER_BYTE_RATE, -5.0, "must be greater than 0"),
        (PRODUCER_BYTE_RATE, 10.5, "cannot be a fractional value"),
        (CONSUMER_BYTE_RATE, 1e300, "too large for a LONG"),
        (REQUEST_PERCENTAGE, float("nan"), "finite"),
        (REQUEST_PERCENTAGE, float("inf"), "finite"),
    ],
)
def test_values_kafka_refuses_are_refused(key: str, value: float, message: str) -> None:
    with pytest.raises(QuotaError, match=message):
        validated_value(key, value)


def test_values_kafka_accepts_are_accepted() -> None:
    assert validated_value(REQUEST_PERCENTAGE, 12.5) == 12.5
    assert validated_value(PRODUCER_BYTE_RATE, 1024.0) == 1024.0
    assert validated_value("controller_mutation_rate", 0.5) == 0.5


ENTITIES = [
    entity(user="alice"),
    entity(user="alice", client_id="app"),
    entity(user=None),
    entity(user=None, client_id=None),
    entity(client_id="app"),
    entity(client_id=None),
]


@pytest.mark.parametrize(
    ("components", "strict", "expected"),
    [
        ([], False, ENTITIES),
        ([], True, []),
        ([(USER, 0, "alice")], False, [ENTITIES[0], ENTITIES[1]]),
        ([(USER, 0, "alice")], True, [ENTITIES[0]]),
        ([(USER, 1, None)], False, [ENTITIES[2], ENTITIES[3]]),
        ([(USER, 2, None)], True, [ENTITIES[0], ENTITIES[2]]),
        ([(USER, 2, None), (CLIENT_ID, 2, None)], True, [ENTITIES[1], ENTITIES[3]]),
        ([(CLIENT_ID, 1, None)], True, [ENTITIES[5]]),
        ([(CLIENT_ID, 0, "app")], False, [ENTITIES[1], ENTITIES[4]]),
        ([("ip", 2, None)], False, []),
    ],
)
def test_filters_match_as_kafka_matches_them(
    components: list[tuple[str, int, str | None]],
    strict: bool,
    expected: list[tuple[tuple[str, str | None], ...]],
) -> None:
    quota_filter = QuotaFilter.of(components, strict)
    matched = [
        e
        for e in ENTITIES
        if (quota_filter.exact or quota_filter.present or not strict) and quota_filter.matches(e)
    ]
    assert matched == expected


@pytest.mark.parametrize(
    ("components", "message", "unsupported"),
    [
        ([("", 0, "x")], "Invalid empty entity type.", False),
        ([(USER, 0, "a"), (USER, 1, None)], "cannot appear more than once", False),
        ([("group", 0, "g")], "Unsupported entity type group", True),
        ([(USER, 0, None)], "MATCH_TYPE_EXACT, but set match string to null", False),
        ([(USER, 1, "a")], "MATCH_TYPE_DEFAULT, but also specified a match string", False),
        ([(USER, 2, "a")], "MATCH_TYPE_SPECIFIED, but also specified a match string", False),
        ([(USER, 7, None)], "Unknown match type 7", False),
        ([("ip", 2, None), (USER, 2, None)], "IP filter component should not be used", False),
    ],
)
def test_filters_kafka_refuses_are_refused(
    components: list[tuple[str, int, str | None]], message: str, unsupported: bool
) -> None:
    with pytest.raises(QuotaError, match=message) as refused:
        QuotaFilter.of(components, False)
    assert refused.value.unsupported is unsupported


# --- the store ----------------------------------------------------------------------------------


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[MetadataStore]:
    store = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    yield store
    await store.close()


async def test_a_quota_set_through_one_broker_applies_on_another(metadata: MetadataStore) -> None:
    here, there = QuotaStore(metadata), QuotaStore(metadata)
    await here.start()
    await there.start()
    try:
        assert not there.configured
        alice_default = entity(user="alice", client_id=None)
        await here.alter(alice_default, {PRODUCER_BYTE_RATE: 1024.0, REQUEST_PERCENTAGE: 25.0})
        await eventually(lambda: there.limit("alice", "x", PRODUCER_BYTE_RATE) is not None)
        assert there.limit("alice", "x", PRODUCER_BYTE_RATE) == (1024.0, ("alice", "x"))
        await here.alter(alice_default, {PRODUCER_BYTE_RATE: None})
        await eventually(lambda: there.limit("alice", "x", PRODUCER_BYTE_RATE) is None)
        assert dict(there.get(alice_default)) == {REQUEST_PERCENTAGE: 25.0}
        await here.alter(alice_default, {REQUEST_PERCENTAGE: None})
        await eventually(lambda: not there.configured)
        assert await metadata.scan(QUOTAS, "quotas0") == []  # an empty entity leaves no key
    finally:
        await here.close()
        await there.close()


async def test_default_and_named_entities_have_distinct_keys(metadata: MetadataStore) -> None:
    store = QuotaStore(metadata)
    await store.start()
    try:
        for name in (None, "<default>", "a/b", "é"):
            await store.alter(entity(user=name, client_id=name), {PRODUCER_BYTE_RATE: 1.0})
        keys = [r.key for r in await metadata.scan(QUOTAS, "quotas0")]
        assert len(keys) == 4
        assert {entity_of(k) for k in keys} == {
            entity(user=n, client_id=n) for n in (None, "<default>", "a/b", "é")
        }
    finally:
        await store.close()


async def test_a_corrupt_stored_quota_is_skipped(metadata: MetadataStore) -> None:
    await metadata.put(f"{QUOTAS}user/bob", b"\xc1 not msgpack")
    await metadata.put(f"{QUOTAS}nonsense", msgpack.packb({PRODUCER_BYTE_RATE: 1.0}))
    await metadata.put(
        f"{QUOTAS}client-id/app", msgpack.packb({PRODUCER_BYTE_RATE: -1.0, "bogus": 3.0})
    )
    await metadata.put(f"{QUOTAS}user/alice", msgpack.packb({PRODUCER_BYTE_RATE: 10.0}))
    store = QuotaStore(metadata)
    await store.start()
    try:
        assert [e for e, _ in store.items()] == [entity(user="alice")]
    finally:
        await store.close()
