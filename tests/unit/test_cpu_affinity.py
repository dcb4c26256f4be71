"""A broker process pinned to one core, and what it starts given every core back.

Each case runs in a child process: pinning the test process itself would confine the rest of
the suite to one core.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from multiprocessing.connection import Connection
from typing import Any

import pytest

from icefloe import cpu_affinity
from icefloe.compaction import local_engine
from icefloe.storage.reader import StreamReader

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="pinning needs Linux and at least two cores",
)


def in_child(check: Callable[[], Any]) -> Any:
    """``check()``'s result, computed in a fresh process (not a pool's daemon: it may start
    processes of its own)."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_report, args=(check, sender))
    child.start()
    try:
        assert receiver.poll(60), "the child process did not answer"
        return receiver.recv()
    finally:
        child.join(10)


def _report(check: Callable[[], Any], sender: Connection) -> None:
    sender.send(check())


def _pin_then_start_a_thread(index: int) -> tuple[int | None, set[int], set[int], Any]:
    core = cpu_affinity.pin_to_one_core(index)
    seen: list[set[int]] = []
    thread = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
    thread.start()
    thread.join()
    return core, os.sched_getaffinity(0), seen[0], cpu_affinity.cores_before_pinning()


@pytest.mark.parametrize("index", [0, 1, 2])
def test_a_broker_is_pinned_to_its_index_th_core_and_so_are_its_threads(index: int) -> None:
    cores = sorted(os.sched_getaffinity(0))
    expected = cores[index % len(cores)]

    core, process, thread, before = in_child(functools.partial(_pin_then_start_a_thread, index))

    assert core == expected
    assert process == {expected}
    assert thread == {expected}  # a thread started later inherits the core
    assert before == frozenset(cores)


def _unpinned_inside() -> tuple[set[int], set[int]]:
    cpu_affinity.pin_to_one_core(0)
    with cpu_affinity.unpinned():
        inside = os.sched_getaffinity(0)
    return inside, os.sched_getaffinity(0)


def test_unpinned_gives_the_block_every_core_then_pins_again() -> None:
    cores = os.sched_getaffinity(0)

    inside, after = in_child(_unpinned_inside)

    assert inside == cores
    assert after == {sorted(cores)[0]}


def _unpinned_without_pinning() -> set[int]:
    with cpu_affinity.unpinned():
        return os.sched_getaffinity(0)


def test_unpinned_in_a_process_never_pinned_changes_nothing() -> None:
    assert in_child(_unpinned_without_pinning) == os.sched_getaffinity(0)


def _compaction_workers() -> Executor:
    return local_engine.LocalCompactionEngine(config=None, workers=1)._pool


def _row_group_threads() -> Executor:
    return StreamReader(None, None, None, None, 0)._row_group_threads  # type: ignore[arg-type]


def _pinned_and_pool_cores(make_pool: Callable[[], Executor]) -> tuple[set[int], set[int]]:
    cpu_affinity.pin_to_one_core(1)
    pool = make_pool()
    try:
        worker = pool.submit(os.sched_getaffinity, 0).result()
    finally:
        pool.shutdown()
    return os.sched_getaffinity(0), worker


@pytest.mark.parametrize(
    "make_pool", [_compaction_workers, _row_group_threads], ids=["compaction", "row-groups"]
)
def test_the_heavy_work_pools_of_a_pinned_broker_run_on_every_core(
    make_pool: Callable[[], Executor],
) -> None:
    """Compaction's worker processes and the threads that decode Parquet row groups."""
    cores = os.sched_getaffinity(0)

    broker, worker = in_child(functools.partial(_pinned_and_pool_cores, make_pool))

    assert broker == {sorted(cores)[1]}
    assert worker == cores


def _refused(index: int) -> tuple[int | None, Any]:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    os.sched_setaffinity = refuse  # type: ignore[assignment]  # this child only
    return cpu_affinity.pin_to_one_core(index), cpu_affinity.cores_before_pinning()


def test_a_system_that_refuses_leaves_the_broker_unpinned() -> None:
    assert in_child(functools.partial(_refused, 0)) == (None, None)
