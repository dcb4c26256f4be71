"""A broker's registration in the cluster: a broker back at its address keeps its node id,
however long it was down (clients hold connections and the coordinators they found per node
id, and wait on an id that never comes back up), and a node id held by a live broker elsewhere
is refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from icefloe.cluster import Cluster, registered_brokers
from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
from icefloe.errors import IcefloeError
from icefloe.ports.base import OpenContext

TTL_S = 30.0
"""Longer than any test: a killed broker's registration stays until the test closes it."""


@pytest.fixture
async def metadata(tmp_path: Path) -> AsyncIterator[SqliteMetadataStore]:
    store = await SqliteMetadataStore.open(
        SqliteMetadataStore.options_model(), OpenContext(data_dir=tmp_path)
    )
    try:
        yield store
    finally:
        await store.close()


async def test_a_broker_restarted_at_its_address_keeps_its_node_id(
    metadata: SqliteMetadataStore,
) -> None:
    killed = Cluster(metadata, TTL_S)
    before = await killed.join("127.0.0.1", 9092, None, None)
    other = await Cluster(metadata, TTL_S).join("127.0.0.1", 9093, None, None)

    # The killed process never left: its registration waits for its session to lapse.
    restarted = Cluster(metadata, TTL_S)
    after = await restarted.join("127.0.0.1", 9092, None, None)

    assert after.node_id == before.node_id != other.node_id
    await killed.leave()  # the old session ends at last; the registration is the new one's
    registered = {b.node_id: b.port for b in await registered_brokers(metadata)}
    assert registered == {before.node_id: 9092, other.node_id: 9093}


async def test_a_broker_back_at_its_address_however_long_after_keeps_its_node_id(
    metadata: SqliteMetadataStore,
) -> None:
    first = await Cluster(metadata, TTL_S).join("127.0.0.1", 9092, None, None)
    gone = Cluster(metadata, TTL_S)
    left = await gone.join("127.0.0.1", 9093, None, None)
    await gone.leave()  # its registration is gone, as after a session lapsed
    assert [b.node_id for b in await registered_brokers(metadata)] == [first.node_id]
    again = await Cluster(metadata, TTL_S).join("127.0.0.1", 9093, None, None)
    assert again.node_id == left.node_id != first.node_id


async def test_a_broker_at_a_new_address_gets_a_new_node_id(
    metadata: SqliteMetadataStore,
) -> None:
    first = await Cluster(metadata, TTL_S).join("127.0.0.1", 9092, None, None)
    moved = await Cluster(metadata, TTL_S).join("127.0.0.2", 9092, None, None)
    assert moved.node_id != first.node_id


async def test_an_addresss_node_id_since_configured_elsewhere_is_given_up(
    metadata: SqliteMetadataStore,
) -> None:
    gone = Cluster(metadata, TTL_S)
    before = await gone.join("127.0.0.1", 9092, None, None)
    await gone.leave()
    await Cluster(metadata, TTL_S).join("127.0.0.1", 9093, None, before.node_id)
    again = await Cluster(metadata, TTL_S).join("127.0.0.1", 9092, None, None)
    assert again.node_id != before.node_id
    registered = {b.node_id: b.port for b in await registered_brokers(metadata)}
    assert registered == {before.node_id: 9093, again.node_id: 9092}


async def test_a_node_id_a_live_broker_holds_elsewhere_is_refused(
    metadata: SqliteMetadataStore,
) -> None:
    await Cluster(metadata, TTL_S).join("127.0.0.1", 9092, None, 7)
    with pytest.raises(IcefloeError, match="broker id 7 is already registered by a live broker"):
        await Cluster(metadata, TTL_S).join("127.0.0.1", 9093, None, 7)


async def test_a_configured_node_id_restarted_at_its_address_takes_its_registration_over(
    metadata: SqliteMetadataStore,
) -> None:
    await Cluster(metadata, TTL_S).join("127.0.0.1", 9092, None, 7)
    again = await Cluster(metadata, TTL_S).join("127.0.0.1", 9092, None, 7)
    assert again.node_id == 7
    assert [b.node_id for b in await registered_brokers(metadata)] == [7]


async def test_a_broker_whose_session_is_lost_registers_again(
    metadata: SqliteMetadataStore,
) -> None:
    cluster = Cluster(metadata, TTL_S)
    me = await cluster.join("127.0.0.1", 9092, None, None)
    try:
        # What a metadata store down or paused past the ttl does: the session and the
        # registration it owned are gone.
        assert cluster._session is not None
        await cluster._session.close()
        deadline = time.monotonic() + 10
        while [b.node_id for b in await registered_brokers(metadata)] != [me.node_id]:
            assert time.monotonic() < deadline, "the broker did not register again"
            await asyncio.sleep(0.05)
    finally:
        await cluster.leave()
    assert await registered_brokers(metadata) == []
