"""The helpers adapters share: a bounded pool for blocking SDK calls, the write-id check of
conditional writes, and the bounded queue behind a watch. (Every adapter that uses them is
also tested against its real server, through its port's contract suite.)"""

from __future__ import annotations

import asyncio
import threading

import pytest

from icefloe.adapters.blocking import BlockingSdk
from icefloe.adapters.watch_queue import WatchQueue
from icefloe.adapters.write_id import WriteIds, new_write_id
from icefloe.errors import ClosedError, NotFoundError, UnavailableError
from icefloe.ports.metadata import EventKind, WatchEvent


class SdkFailure(Exception):
    """Stands for an SDK's exception type (this module plays the SDK)."""


def sdk(**kwargs: object) -> BlockingSdk:
    return BlockingSdk(
        "the test adapter",
        threads=2,
        thread_name_prefix="test-sdk",
        translate=lambda exc, what: UnavailableError(f"{what}: {exc}"),
        sdk_modules=(__name__,),
        **kwargs,  # type: ignore[arg-type]
    )


async def test_calls_run_on_the_pool_not_on_the_event_loop() -> None:
    pool = sdk()
    thread = await pool.call("who", lambda: threading.current_thread().name)
    await pool.close()
    assert thread.startswith("test-sdk")


async def test_the_sdks_errors_are_translated_and_chained() -> None:
    pool = sdk()

    def fail() -> None:
        raise SdkFailure("503")

    with pytest.raises(UnavailableError, match="get 'k': 503") as caught:
        await pool.call("get 'k'", fail)
    await pool.close()
    assert isinstance(caught.value.__cause__, SdkFailure)


async def test_icefloe_errors_and_other_exceptions_pass_unchanged() -> None:
    pool = sdk()

    def missing() -> None:
        raise NotFoundError("no such object")

    def bug() -> None:
        raise KeyError("adapter bug")

    with pytest.raises(NotFoundError):
        await pool.call("get", missing)
    with pytest.raises(KeyError):
        await pool.call("get", bug)
    await pool.close()


async def test_nothing_starts_after_close_and_close_waits_for_running_calls() -> None:
    pool = sdk()
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(10)
        return "done"

    running = asyncio.create_task(pool.call("slow", slow))
    await asyncio.to_thread(started.wait, 10)
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0.05)
    assert not closing.done()  # the running call is waited for…
    with pytest.raises(ClosedError, match="the test adapter is closed"):
        await pool.call("late", lambda: None)  # …and nothing new starts
    release.set()
    assert await running == "done"
    await closing


class Refused(Exception):
    """A store's "condition not met"."""


async def test_a_refused_write_whose_earlier_attempt_won_is_a_success() -> None:
    write_id = new_write_id()
    stored = {"k": {"write-id": write_id}}

    async def head(key: str) -> dict[str, str] | None:
        return stored.get(key)

    async def retried_write() -> None:
        raise Refused("412")

    ids = WriteIds("write-id", head, Refused)
    assert await ids.send("k", write_id, retried_write()) is None


async def test_a_refused_write_over_someone_elses_object_is_a_refusal() -> None:
    async def head(key: str) -> dict[str, str] | None:
        return {"write-id": "another"} if key == "taken" else None

    async def write() -> None:
        raise Refused("412")

    ids = WriteIds("write-id", head, Refused)
    over_another = await ids.send("taken", new_write_id(), write())
    over_nothing = await ids.send("free", new_write_id(), write())

    assert over_another is not None
    assert over_another.taken is True
    assert over_nothing is not None
    assert over_nothing.taken is False


def put(key: str) -> WatchEvent:
    return WatchEvent(EventKind.PUT, key, 1)


async def test_a_watch_queue_delivers_events_in_order() -> None:
    queue = WatchQueue(limit=3)
    assert queue.put(put("a"))
    assert queue.put(put("b"))
    assert [(await queue.get()).key, (await queue.get()).key] == ["a", "b"]  # type: ignore[union-attr]


async def test_a_full_watch_queue_holds_one_reset_instead_of_growing() -> None:
    queue = WatchQueue(limit=2)
    queue.put(put("a"))
    queue.put(put("b"))
    assert queue.put(put("c")) is False

    first = await queue.get()
    assert first is not None
    assert first.kind is EventKind.RESET
    queue.put(put("d"))
    assert (await queue.get()).key == "d"  # type: ignore[union-attr]


async def test_a_closed_watch_queue_ends_a_waiting_consumer() -> None:
    queue = WatchQueue(limit=2)
    waiting = asyncio.create_task(queue.get())
    await asyncio.sleep(0)
    queue.close()
    assert await asyncio.wait_for(waiting, 1) is None
    assert queue.put(put("late")) is False
