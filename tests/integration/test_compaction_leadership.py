"""The compaction leader through metadata-store outages, on etcd and on Oxia.

Sessions: one whose server stops answering is reported lost within its ttl of the last
keep-alive the server answered; one whose server answers slowly, but in time, keeps proving
the leader's lease; an etcd session counts its ttl from when it was asked for, and goes on
after etcd is killed and started again.

Leadership: two brokers under a steady produce load, the store killed -9 and started again
twice, then paused past the compaction lease: at no time does a leader act after the next one
was elected (the store's own order of the saga records' writes and terms says so), conflicts
do not loop, and within a minute of the last fault both tables hold every acknowledged record
exactly once. (``python -m tests.chaos.leadership`` runs the same for as long as one likes.)
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from icefloe.compaction.leadership import Lease
from icefloe.storage.engine import StreamStorage
from tests.support.leadership import outage_run
from tests.support.metadata_servers import MetadataServer, start_etcd, start_oxia

TTL_S = 3.0
LATE_S = 0.5
"""How late after the ttl a loss may be reported: the event loop's scheduling, nothing more."""
SLOW_S = 0.8
"""How long each keep-alive may wait for a server that stops and goes on by turns: more than
a sixth of the ttl, less than a third."""
RESTART_TTL_S = 6.0
"""Long enough for etcd to start again before the lease it keeps expires, on most days."""
RESTART_S = 2.0
"""Time enough for a keep-alive on a new stream once etcd answers again."""


def _server(backend: str, workdir: Path) -> MetadataServer:
    return start_etcd(workdir) if backend == "etcd" else start_oxia(workdir)


# --- sessions -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["etcd", "oxia"])
async def test_a_session_whose_server_stops_answering_is_lost_within_its_ttl(
    backend: str, tmp_path: Path
) -> None:
    server = _server(backend, tmp_path)
    try:
        config = server.config(tmp_path, "lease")
        async with await StreamStorage.open(config) as storage:
            session = await storage.metadata.open_session(TTL_S)
            await asyncio.sleep(TTL_S / 2)  # a keep-alive has been answered
            paused_at = time.monotonic()
            server.process.pause()
            try:
                await asyncio.wait_for(asyncio.shield(session.lost), TTL_S + 10)
                lost_after = time.monotonic() - paused_at
            finally:
                server.process.resume()
            # The last keep-alive answered was sent before the pause: the server holds the
            # session until a ttl after it at the least, and no longer may its holder act.
            assert lost_after <= session.ttl + LATE_S, f"reported lost {lost_after:.1f} s later"
            await session.close()
    finally:
        server.process.stop()


@pytest.mark.parametrize("backend", ["etcd", "oxia"])
async def test_a_leader_keeps_proving_its_lease_while_the_server_answers_in_time(
    backend: str, tmp_path: Path
) -> None:
    """The server stops and goes on by turns, each keep-alive answered within a third of the
    ttl, so the session never comes near expiring: the leader must never have to stop."""
    server = _server(backend, tmp_path)
    try:
        config = server.config(tmp_path, "slow")
        async with await StreamStorage.open(config) as storage:
            session = await storage.metadata.open_session(TTL_S)
            assert session.ttl == TTL_S
            lease = Lease(session, 1)
            least = float("inf")
            for _ in range(5):
                server.process.pause()
                least = min(least, await _least_margin(lease, SLOW_S))
                server.process.resume()
                least = min(least, await _least_margin(lease, SLOW_S))
            assert session.alive
            assert least > 0, f"the leader would have stopped ({-least:.2f} s past its deadline)"
            await session.close()
    finally:
        server.process.resume()
        server.process.stop()


async def _least_margin(lease: Lease, seconds: float) -> float:
    """The least time left before ``lease``'s deadline over the next ``seconds``."""
    least = float("inf")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        least = min(least, lease.deadline() - time.monotonic())
        await asyncio.sleep(0.02)
    return least


async def test_an_etcd_session_counts_its_ttl_from_when_the_lease_was_asked_for(
    tmp_path: Path,
) -> None:
    """etcd counts a lease's ttl from when it grants it: a grant answered late must not
    lengthen what the holder believes it holds."""
    server = start_etcd(tmp_path)
    try:
        config = server.config(tmp_path, "grant")
        async with await StreamStorage.open(config) as storage:
            server.process.pause()
            asked = time.monotonic()
            opening = asyncio.create_task(storage.metadata.open_session(TTL_S))
            await asyncio.sleep(1.0)  # the grant waits for etcd
            server.process.resume()
            session = await opening
            assert time.monotonic() - asked >= 1.0
            assert session.renewed_at <= asked + 0.5, "the ttl counted from the late answer"
            await session.close()
    finally:
        server.process.resume()
        server.process.stop()


async def test_an_etcd_session_goes_on_after_etcd_is_killed_and_started_again(
    tmp_path: Path,
) -> None:
    """etcd keeps its leases through a restart; the session's keep-alive stream does not
    survive it. The session must renew its lease on a new stream, or report itself lost if
    etcd came back too late: it must never go on unrenewed, its holder unaware."""
    server = start_etcd(tmp_path)
    try:
        config = server.config(tmp_path, "restart")
        async with await StreamStorage.open(config) as storage:
            session = await storage.metadata.open_session(RESTART_TTL_S)
            await asyncio.sleep(RESTART_TTL_S / 2)  # keep-alives go over their stream
            last = session.renewed_at
            for _ in range(1000):  # until the next keep-alive is answered
                if session.renewed_at != last:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)  # killed between two keep-alives: the stream is idle
            last, killed_at = session.renewed_at, time.monotonic()
            assert server.process.kill() == -signal.SIGKILL
            await asyncio.to_thread(server.process.start)
            back_at = time.monotonic()
            while session.alive and session.renewed_at == last:
                assert time.monotonic() < last + session.ttl + LATE_S, "neither renewed nor lost"
                await asyncio.sleep(0.05)
            if session.alive:
                assert session.renewed_at > killed_at, "renewed by no keep-alive after the restart"
            else:  # etcd came back too late for a keep-alive to go through in time
                assert back_at > last + session.ttl - RESTART_S, "lost though etcd kept the lease"
            await session.close()
    finally:
        server.process.stop()


# --- leadership through outages of the store -----------------------------------------------


@pytest.mark.parametrize("backend", ["etcd", "oxia"])
def test_one_leader_at_a_time_through_store_outages_and_the_tables_catch_up(
    backend: str, tmp_path: Path
) -> None:
    """Two brokers under a steady produce load; the store killed -9 and started again twice,
    then paused past the compaction lease. Each fault ends the leadership of the time and
    another begins; no leader acts after the next was elected; conflicts do not loop; and
    within a minute of the last fault both tables hold every acknowledged record once."""
    outcome = outage_run(backend, tmp_path, ["kill", "kill", "pause"])
    print(outcome.figures())
    outcome.check()
