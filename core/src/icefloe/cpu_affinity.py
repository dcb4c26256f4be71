"""A broker process on one core; the processes it starts on every core it had.

A broker's event loop hands work to its own threads (a WAL write, a SQLite commit, a row group
to decode) and is woken by them when it is done, several times per flush. Which core a woken
thread runs on is the kernel's choice; when it is another core than the waker's, the wake-up
takes an interrupt between the cores, which on virtual machines costs the waker tens to
hundreds of microseconds of CPU (a send to a peer blocked on the other core took 30-140 µs on
the two-core machine of docs/performance.md, 7-9 µs on the same core). The threads mostly take
turns holding the GIL anyway, so a second core gains them little: on one core, the same broker
took the Java producer's records about a quarter faster with a quarter less CPU, and served
catch-up reads from Parquet with a sixth less CPU. Each broker of a host gets its own core (the
``index``-th of those the process may use), as in thread-per-core designs.

What a pinned broker starts to do heavy work of its own (its compactor's process, compaction
worker processes, Spark's JVM) is given every core back: :func:`cores_before_pinning`,
:func:`use_cores`, :func:`unpinned`. So are its threads that work for milliseconds at a time on
their own, mostly without the GIL (decoding Parquet row groups, rebuilding their batches):
:func:`on_every_core`. On the broker's core they would only take turns with its event loop;
on another, they work while it serves requests.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator

_cores_before: frozenset[int] | None = None


def pin_to_one_core(index: int) -> int | None:
    """Confine the calling thread, and the threads and processes it starts from now on, to one
    of the cores it may use: the ``index``-th, counting round.

    Returns:
        The core; ``None`` where there is nothing to gain (one core) or no way to do it (not
        Linux, or the system refuses).
    """
    global _cores_before
    if not hasattr(os, "sched_getaffinity"):  # not Linux
        return None
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    core = cores[index % len(cores)]
    try:
        os.sched_setaffinity(0, {core})
    except OSError:  # a sandbox that forbids it
        return None
    _cores_before = frozenset(cores)
    return core


def cores_before_pinning() -> frozenset[int] | None:
    """The cores this process could use before :func:`pin_to_one_core`; ``None`` if it was
    not pinned."""
    return _cores_before


def use_cores(cores: Iterable[int] | None) -> None:
    """Let the calling thread, and what it starts from now on, run on ``cores`` (``None``:
    leave it as it is)."""
    if cores is not None and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cores)


def on_every_core() -> None:
    """Let the calling thread run on every core the process had before it was pinned (none
    changes if it was not): the initializer of a pool whose work is long and needs little of
    the GIL."""
    use_cores(cores_before_pinning())


@contextlib.contextmanager
def unpinned() -> Iterator[None]:
    """The calling thread on every core the process had before it was pinned, for the block:
    a process started in it (a JVM) is not confined to the broker's core."""
    before = cores_before_pinning()
    if before is None:
        yield
        return
    pinned = os.sched_getaffinity(0)
    use_cores(before)
    try:
        yield
    finally:
        use_cores(pinned)
