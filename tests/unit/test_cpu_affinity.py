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


def _compaction_worker_cores() -> tuple[set[int], set[int]]:
    cpu_affinity.pin_to_one_core(1)
    engine = local_engine.LocalCompactionEngine(config=None, workers=1)
    try:
        worker = engine._pool.submit(os.sched_getaffinity, 0).result()
    finally:
        engine._pool.shutdown()
    return os.sched_getaffinity(0), worker


def test_compaction_workers_of_a_pinned_broker_run_on_every_core() -> None:
    cores = os.sched_getaffinity(0)

    broker, worker = in_child(_compaction_worker_cores)

    assert broker == {sorted(cores)[1]}
    assert worker == cores


def _row_group_thread_cores() -> tuple[set[int], set[int]]:
    cpu_affinity.pin_to_one_core(1)
    reader = StreamReader(None, None, None, None, 0)  # type: ignore[arg-type]  # the pool only
    try:
        thread = reader._row_group_threads.submit(os.sched_getaffinity, 0).result()
    finally:
        reader._row_group_threads.shutdown()
    return os.sched_getaffinity(0), thread


def test_a_pinned_brokers_row_group_threads_run_on_every_core() -> None:
    cores = os.sched_getaffinity(0)

    broker, thread = in_child(_row_group_thread_cores)

    assert broker == {sorted(cores)[1]}
    assert thread == cores


def _refused(index: int) -> tuple[int | None, Any]:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    os.sched_setaffinity = refuse  # type: ignore[assignment]  # this child only
    return cpu_affinity.pin_to_one_core(index), cpu_affinity.cores_before_pinning()


def test_a_system_that_refuses_leaves_the_broker_unpinned() -> None:
    assert in_child(functools.partial(_refused, 0)) == (None, None)
