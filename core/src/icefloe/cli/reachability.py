"""``icefloe config check``: is each configured backend reachable?

Each backend is opened the way ``serve`` opens it (``resolve`` then ``open``, the object WAL and
the table formats on top of the object store), asked one cheap question (a get of a missing
key, a head of a missing object, the last commit of a table that does not exist) and closed,
all within a timeout. Compaction engines are not started: that starts workers or a JVM.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from icefloe import config as configuration
from icefloe.errors import IcefloeError, NotFoundError
from icefloe.ports import WAL, MetadataStore, ObjectStore, TableFormat
from icefloe.ports.base import OpenContext, Port, PortKind
from icefloe.table_names import table_name
from icefloe.tables import layout

PROBE: Final = "icefloe-config-check"
"""The key, object and topic the probes ask about; nothing is ever stored under it."""

P = TypeVar("P", bound=Port)


@dataclass(frozen=True, slots=True)
class Reach:
    """One backend's answer."""

    kind: PortKind
    backend: str
    millis: float = 0.0
    problem: str | None = None
    """Why it is unreachable; ``None`` when it answered."""
    skipped: str | None = None
    """Why it was not tried (a backend it runs on is unreachable)."""
    timed_out: bool = False
    """It did not answer in time, and its open or question was left running."""

    @property
    def reachable(self) -> bool:
        return self.problem is None and self.skipped is None

    def line(self) -> str:
        head = f"{self.kind.value}: {self.backend}"
        if self.skipped is not None:
            return f"{head} — not checked: {self.skipped}"
        if self.problem is not None:
            return f"{head} — unreachable: {self.problem}"
        return f"{head} — reachable ({self.millis:.0f} ms)"


def run(config: configuration.Config, data_dir: Path, limit_s: float) -> list[Reach]:
    """:func:`check` on an event loop of its own, which is left as it is when a backend timed
    out: closing the loop would wait for that backend's calls. The caller then exits at once
    (``os._exit``), since the interpreter would wait for their threads too."""
    loop = asyncio.new_event_loop()
    results = loop.run_until_complete(check(config, data_dir, limit_s))
    if not any(r.timed_out for r in results):
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    return results


async def check(config: configuration.Config, data_dir: Path, limit_s: float) -> list[Reach]:
    """Probe the metadata store, the object store, the WAL and every table format.

    Args:
        data_dir: Passed to the backends as ``serve`` passes ``config.data_dir``.
        limit_s: Seconds each backend has to open and answer.

    Raises:
        IcefloeError: a port's configuration is invalid (``resolve`` says why).
    """
    results = []
    metadata = configuration.resolve_one(config, MetadataStore)
    context = OpenContext(data_dir=data_dir)
    reach, opened = await _probe(metadata, context, limit_s, lambda m: m.get(PROBE))
    results.append(reach)
    if opened is not None:
        await opened.close()

    store_backend = configuration.resolve_one(config, ObjectStore)
    wal_backend = configuration.resolve_one(config, WAL)
    tables = configuration.resolve(config, TableFormat)
    reach, store = await _probe(store_backend, context, limit_s, lambda s: s.head(PROBE))
    results.append(reach)
    if store is None:
        why = f"the object store ({store_backend.name}) is unreachable"
        results.append(Reach(PortKind.WAL, wal_backend.name, skipped=why))
        results.extend(Reach(PortKind.TABLE, t.name, skipped=why) for t in tables)
        return results
    try:
        # The WAL and the table formats live in the object store, as under `serve`.
        context = OpenContext(data_dir=data_dir, object_store=store, config=config)
        reach, wal = await _probe(wal_backend, context, limit_s, _nothing)
        results.append(reach)
        context = OpenContext(data_dir=data_dir, object_store=store, wal=wal, config=config)
        name = table_name(config.table.identifier, PROBE)
        for backend in tables:
            reach, table_format = await _probe(
                backend,
                context,
                limit_s,
                # The spec is made inside the probe: a store may refuse to name table locations.
                lambda t: _absent(t.last_commit(layout.table_spec(store, name, PROBE))),
            )
            results.append(reach)
            if table_format is not None:
                await table_format.close()
        if wal is not None:
            await wal.close()
    finally:
        # A probe that timed out may still be using the store; closing it would wait for that.
        if not any(r.timed_out for r in results):
            await store.close()
    return results


async def _probe(
    backend: configuration.ResolvedBackend[P],
    context: OpenContext,
    limit_s: float,
    ask: Callable[[P], Awaitable[object]],
) -> tuple[Reach, P | None]:
    """Open ``backend`` and ``ask`` it one question within ``limit_s`` seconds; the adapter comes
    back open when it answered."""

    async def open_and_ask() -> P:
        adapter = await backend.open(context)
        try:
            await ask(adapter)
        except BaseException:
            await adapter.close()
            raise
        return adapter

    start = time.perf_counter()
    task = asyncio.ensure_future(open_and_ask())
    await asyncio.wait([task], timeout=limit_s)
    if not task.done():
        # Not awaited after cancelling: an SDK call on a thread ends only at the SDK's own
        # timeouts and retries, which the check must not wait for (see ``run``).
        task.cancel()
        problem = f"no answer within {limit_s:g} s"
        return Reach(backend.kind, backend.name, problem=problem, timed_out=True), None
    try:
        adapter = task.result()
    except Exception as exc:  # noqa: BLE001 - whatever the backend raises, it is unreachable
        return Reach(backend.kind, backend.name, problem=_reason(exc)), None
    return Reach(backend.kind, backend.name, (time.perf_counter() - start) * 1000), adapter


async def _nothing(_adapter: Port) -> None:
    """The object WAL answers nothing the object store has not answered already."""


async def _absent(question: Awaitable[object]) -> None:
    """A table that does not exist is the expected answer: the catalog was reached."""
    with contextlib.suppress(NotFoundError):
        await question


def _reason(exc: BaseException) -> str:
    """One line: Icefloe's own errors say what went wrong; others also need their type."""
    text = next(_lines(str(exc)), "")
    if isinstance(exc, IcefloeError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _lines(text: str) -> Iterator[str]:
    return (line.strip() for line in text.splitlines() if line.strip())
