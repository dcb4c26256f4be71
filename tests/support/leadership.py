"""Compaction leadership through faults of the metadata store: `icefloe serve` on a server
killed -9 and started again, or paused, under a steady produce load (:func:`outage_run`), and
what the leadership must keep meanwhile (:meth:`Outcome.check`): no leader acts after the next
one was elected, conflicts do not loop, and the tables catch up with every acknowledged record
exactly once. The suite runs a short one (tests/integration/test_compaction_leadership.py),
``python -m tests.chaos.leadership`` a long one.

The record comes from the metadata store, not from the brokers' logs: the store orders every
write (etcd revisions, Oxia version ids of one shard), each leadership's term is the version
its leader key got, and each saga record carries the term of the leader that wrote it. A write
of term ``t`` at version ``v`` with a term ``t < T < v`` elected in between is a step of an old
leader taken after a newer one took over: two leaders acting at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from icefloe import config as configuration
from icefloe.compaction.committer import TASKS
from icefloe.compaction.service import LEADER_KEY
from icefloe.config import Config
from icefloe.errors import IcefloeError
from icefloe.keyspace import COMPACTION, prefix_end
from icefloe.ports.base import OpenContext
from icefloe.ports.metadata import EventKind, MetadataStore
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.metadata_servers import MetadataServer, start_etcd, start_oxia
from tests.support.table_readers import duckdb_rows, iceberg_rows
from tests.support.tables_cli import tables_json

LEADS = re.compile(r"compactor\[(\d+)\] this broker leads compaction \(term (\d+)\)")
CONFLICTS = re.compile(r"AlreadyExistsError|ConflictError")
NAMESPACE = "leadership"
"""Where the brokers' keys are in the metadata store."""
DEATHS = re.compile(r"^Process \S+:$", re.MULTILINE)
"""A broker's or compactor's process ended by an exception nothing handled (multiprocessing's
header of its traceback). A compactor that exits because it cannot reach the store at its
start says so and is started again: that is no death."""


def serve_environment(backend: str, server: MetadataServer, lease_ttl_s: float) -> dict[str, str]:
    """`icefloe serve` on ``server`` (``etcd`` or ``oxia``), compacting all the time under a
    compaction lease of ``lease_ttl_s``."""
    section = f"ICEFLOE_METADATA__{backend.upper()}"
    addresses = "ENDPOINTS" if backend == "etcd" else "ADDRESSES"
    return {
        "ICEFLOE_METADATA__BACKEND": backend,
        f"{section}__{addresses}": f'["{server.address}"]',
        f"{section}__NAMESPACE": NAMESPACE,
        "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
        "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
        "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
        "ICEFLOE_COMPACTOR__LEASE_TTL_S": str(lease_ttl_s),
    }


class Load:
    """An idempotent producer sending a record every few milliseconds from a thread of its
    own; each record's value is its number, so each is told apart in the tables. A producer
    that fails for good (its idempotence state lost) is replaced by a new one, and counted:
    the load goes on, its records in flight reported failed."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked: list[bytes] = []
        self.failed: list[tuple[bytes, str]] = []
        self.fatal: list[str] = []
        self._bootstrap = bootstrap
        self._topic = topic
        self._stop = threading.Event()
        self._unflushed = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()

    def _producer(self) -> Producer:
        return Producer(
            {
                "bootstrap.servers": self._bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
            }
        )

    def _run(self) -> None:
        try:
            self._unflushed = self._produce()
        except BaseException as exc:
            self._error = exc
            raise

    def _produce(self) -> int:
        """Produce until stopped; the records left unanswered at the end."""
        producer = self._producer()
        i = 0
        while not self._stop.is_set():
            try:
                producer.produce(self._topic, b"%d" % i, on_delivery=self._delivered)
                producer.poll(0.005)
            except KafkaException as exc:
                error = exc.args[0]
                if not error.fatal():
                    raise
                self.fatal.append(error.str())
                with contextlib.suppress(KafkaException):  # the reports of its records
                    producer.flush(30)
                producer = self._producer()
            i += 1
        return producer.flush(130)

    def _delivered(self, error: KafkaError | None, message: Message) -> None:
        value = message.value()
        assert value is not None
        if error is None:
            self.acked.append(value)
        else:
            self.failed.append((value, error.str()))

    def stop(self) -> list[bytes]:
        """Stop producing, wait for every answer, and return the acknowledged values."""
        self._stop.set()
        self._thread.join(150)
        assert not self._thread.is_alive(), "the producer did not stop"
        assert self._error is None, f"the load stopped early: {self._error!r}"
        assert self._unflushed == 0, "records left unanswered"
        return self.acked

    def abandon(self) -> None:
        """Stop producing without waiting for the records under way."""
        self._stop.set()

    def check_once(self, rows: list[bytes], table: str) -> None:
        """Every acknowledged record is in ``rows`` once; a record whose delivery failed at
        most once (it may have been written); nothing else."""
        counts = Counter(rows)
        failed = {value for value, _ in self.failed}
        missing = [v for v in self.acked if counts[v] == 0]
        twice = [v for v, n in counts.items() if n > 1]
        unknown = [v for v in counts if v not in failed and v not in set(self.acked)]
        assert not missing, f"{table}: {len(missing)} acknowledged records missing: {missing[:5]}"
        assert not twice, f"{table}: {len(twice)} records more than once: {twice[:5]}"
        assert not unknown, f"{table}: {len(unknown)} records never produced: {unknown[:5]}"


@dataclass(frozen=True, slots=True)
class SagaWrite:
    """A saga record as one write left it."""

    key: str
    version: int
    term: int
    state: str


class StoreOrder:
    """Follows the compaction keys of the metadata store from a process of its own (gRPC's
    asyncio clients serve one event loop of a process): every term (a version the leader key
    got) and every saga write the watch saw, read back; it writes them to ``path`` a JSON line
    each, which this side reads as it is asked."""

    def __init__(self, config: Config, path: Path) -> None:
        self._path = path
        self._process = _SPAWN.Process(target=follow_store, args=(config, path), daemon=True)
        self._read = 0
        self._ready = False
        self._error: str | None = None
        self.terms: list[int] = []
        self.writes: list[SagaWrite] = []

    def start(self) -> None:
        """Start following (:meth:`wait_until_following` waits for the watch)."""
        self._process.start()

    def wait_until_following(self) -> None:
        """Return once the watch is established: no write after this is missed."""
        _wait_for(self._following, "the store's watch started", 60)

    def _following(self) -> bool:
        self.refresh()
        return self._ready

    def stop(self) -> None:
        """Stop following; raise what stopped it early, if anything did."""
        if self._process.pid is None:
            return  # never started
        self.refresh()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(30)
        assert self._error is None, f"following the store failed: {self._error}"

    def refresh(self) -> None:
        """Take in what the follower wrote since the last time."""
        if not self._path.exists():
            assert self._process.is_alive(), "the store's follower died before it started"
            return
        with self._path.open("rb") as lines:
            lines.seek(self._read)
            for line in lines:
                if not line.endswith(b"\n"):
                    break  # not all written yet: read it next time
                self._read += len(line)
                self._take(json.loads(line))
        assert self._error is None, f"following the store failed: {self._error}"

    def _take(self, seen: dict[str, Any]) -> None:
        if "ready" in seen:
            self._ready = True
        elif "error" in seen:
            self._error = seen["error"]
        elif "leader" in seen:
            if seen["leader"] not in self.terms:
                self.terms.append(seen["leader"])
                self.terms.sort()
        else:
            self.writes.append(SagaWrite(**seen))

    def committed_a_run(self) -> bool:
        """Whether a leader committed a run it planned to the tables."""
        self.refresh()
        states: dict[str, set[str]] = {}
        for write in self.writes:
            states.setdefault(write.key, set()).add(write.state)
        return any({"planned", "committed"} <= seen for seen in states.values())

    def acted(self, term: int) -> bool:
        """Whether a leader of ``term`` or a later one wrote a saga record (it planned a run,
        took one over, or took one a step further)."""
        self.refresh()
        return any(write.term >= term for write in self.writes)

    def overlaps(self) -> list[str]:
        """Saga writes made by a leader after a newer leader was elected."""
        self.refresh()
        found = []
        for write in self.writes:
            newer = [t for t in self.terms if write.term < t < write.version]
            if newer:
                found.append(f"{write} after term {newer[0]} began")
        return found


_SPAWN = multiprocessing.get_context("spawn")


def follow_store(config: Config, path: Path) -> None:
    """Body of :class:`StoreOrder`'s process."""
    with path.open("a") as out:

        def write(**seen: Any) -> None:
            out.write(json.dumps(seen) + "\n")
            out.flush()

        try:
            asyncio.run(_follow(config, write))
        except Exception as exc:  # reported to the test, which fails on it
            write(error=repr(exc))
            raise


async def _follow(config: Config, write: Callable[..., None]) -> None:
    backend = configuration.resolve_one(config, MetadataStore)
    store = await backend.open(OpenContext(data_dir=Path(config.data_dir)))
    seen: set[tuple[str, int]] = set()

    async def note(key: str, version: int, value: bytes) -> None:
        if (key, version) not in seen:
            seen.add((key, version))
            payload = msgpack.unpackb(value, raw=False)
            write(
                key=key, version=version, term=int(payload.get("term", 0)), state=payload["state"]
            )

    async def read_all() -> None:
        """Read what the watch may have missed (it started, or lost events)."""
        while True:
            try:
                leader = await store.get(LEADER_KEY)
                records = [r async for r in store.scan_all(TASKS, prefix_end(TASKS))]
                break
            except IcefloeError:  # the store is down: the watch waits for it too
                await asyncio.sleep(0.2)
        if leader is not None:
            write(leader=leader.version)
        for record in records:
            await note(record.key, record.version, record.value)

    try:
        async with store.watch(COMPACTION) as watch:
            await read_all()
            write(ready=True)
            async for event in watch:
                if event.kind is EventKind.RESET:
                    await read_all()
                elif event.kind is EventKind.PUT and event.key == LEADER_KEY:
                    write(leader=event.version)
                elif event.kind is EventKind.PUT and event.key and event.key.startswith(TASKS):
                    try:
                        record = await store.get(event.key)
                    except IcefloeError:
                        continue  # written, but unread: the check sees less, never wrongly
                    if record is not None and record.version == event.version:
                        await note(record.key, record.version, record.value)
    finally:
        await store.close()


def kill_and_restart(server: MetadataServer, down_s: float) -> int:
    """SIGKILL the server, keep it down ``down_s``, start it again on its data; its exit
    status (``-9``: it really was killed)."""
    status = server.process.kill()
    time.sleep(down_s)
    server.process.start()
    return status


def pause(server: MetadataServer, seconds: float) -> None:
    """Freeze the server (SIGSTOP) for ``seconds``; it is checked frozen before and after."""
    server.process.pause()
    try:
        time.sleep(seconds)
        assert server.process.paused(), "the server went on during its pause"
    finally:
        server.process.resume()


def led_terms(log: str) -> list[int]:
    """The terms the compactors say they led, in the brokers' log."""
    return [int(match[2]) for match in LEADS.finditer(log)]


# --- a run of faults ------------------------------------------------------------------------

LEASE_TTL_S = 3
"""The compaction lease of the runs: whole seconds, as etcd grants them."""
CATCH_UP_S = 60
"""How soon after the last fault the tables must hold every acknowledged record."""
LEADER_AFTER_FAULT_S = 60
"""How soon after a fault a leader of a newer term must act."""


@dataclass
class Outcome:
    """What a run of faults left, for :meth:`check`."""

    backend: str
    load: Load
    faults: list[str]
    """Each fault, and when it came (seconds since the load started)."""
    loaded_s: float
    """How long the load ran."""
    terms: list[int]
    overlaps: list[str]
    caught_up_s: float
    """How long after the last fault the tables held everything the stream did."""
    rows: dict[str, list[bytes]]
    """The values in each table."""
    log: str

    def figures(self) -> str:
        return (
            f"{self.backend}: {len(self.load.acked)} records acknowledged "
            f"({len(self.load.failed)} failed, {len(self.load.fatal)} producers failed for "
            f"good) in {self.loaded_s:.0f} s; faults {', '.join(self.faults)}; "
            f"{len(self.terms)} terms; tables caught up {self.caught_up_s:.1f} s after the last "
            f"fault; {len(CONFLICTS.findall(self.log))} conflict lines"
        )

    def check(self) -> None:
        """What the leadership must keep through the faults (the module docstring)."""
        assert len(self.load.acked) > 500, "the load hardly ran"
        for table, values in self.rows.items():
            self.load.check_once(values, table)
        assert not self.overlaps, f"a leader acted after the next was elected: {self.overlaps}"
        assert len(self.terms) > len(self.faults), f"not a new leader each fault: {self.terms}"
        led = led_terms(self.log)
        assert set(led) <= set(self.terms), "a leadership the store did not record"
        assert len(led) == len(set(led)), "two compactors led in one term"
        conflicts = len(CONFLICTS.findall(self.log))
        assert conflicts <= 5 * len(self.faults), f"conflicts loop: {conflicts} lines"
        assert not DEATHS.findall(self.log), "a broker's or compactor's process died"


def outage_run(backend: str, workdir: Path, faults: Sequence[str]) -> Outcome:
    """`icefloe serve` with two brokers on a metadata server of its own (``etcd`` or ``oxia``)
    under :class:`Load`; once a run was committed, each of ``faults`` in turn (``kill``: the
    server killed -9 and started again after a lease's ttl; ``pause``: frozen two seconds past
    it), each followed by a leader of a newer term acting; then the tables caught up."""
    server = start_etcd(workdir / backend) if backend == "etcd" else start_oxia(workdir / backend)
    data = workdir / "data"
    env = serve_environment(backend, server, LEASE_TTL_S)
    order = StoreOrder(server.config(workdir / "order", NAMESPACE), workdir / "order.jsonl")
    running: RunningIcefloe | None = None
    load: Load | None = None
    done: list[str] = []
    try:
        order.start()  # its imports while the brokers start (it reads what it missed then)
        running = start_icefloe(data, brokers=2, env=env)
        order.wait_until_following()
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic("load", 2)])["load"].result(30)
        load = Load(running.bootstrap, "load")
        started = time.monotonic()
        _wait_for(order.committed_a_run, "a compaction run committed", 90)
        for fault in faults:
            before = max(order.terms)
            if fault == "kill":
                status = kill_and_restart(server, LEASE_TTL_S)
                assert status == -signal.SIGKILL, f"{backend} exited with {status}"
            else:
                pause(server, LEASE_TTL_S + 2)
            done.append(f"{fault} at {time.monotonic() - started:.0f} s")
            _wait_for(
                lambda before=before: order.acted(before + 1),
                f"a leader after the {fault}",
                LEADER_AFTER_FAULT_S,
            )
        last_fault = time.monotonic()
        acked_before = len(load.acked)
        time.sleep(2)  # the load goes on after the faults
        load.stop()
        assert len(load.acked) > acked_before, "no record acknowledged after the last fault"
        loaded_s = time.monotonic() - started
        rows = _caught_up(data, env, last_fault)
        caught_up_s = time.monotonic() - last_fault
        delta = next(r for r in rows if r["format"] == "delta")
        iceberg = next(r for r in rows if r["format"] == "iceberg")
        in_tables = {
            "Delta": [row[3] for row in duckdb_rows(f"delta_scan('{delta['location']}')")],
            "Iceberg": [
                row[3]
                for row in iceberg_rows(iceberg["identifier"], data / "iceberg-catalog.db", {})
            ],
        }
    finally:
        if load is not None:
            load.abandon()  # once stopped, a no-op; after a failure, it ends by itself
        if running is not None:
            running.stop()
        order.stop()
        server.process.resume()
        server.process.stop()
    return Outcome(
        backend,
        load,
        done,
        loaded_s,
        order.terms,
        order.overlaps(),
        caught_up_s,
        in_tables,
        running.log_path.read_text(),
    )


def _wait_for(condition: Callable[[], bool], what: str, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s: {what}"
        time.sleep(0.2)


def _caught_up(data: Path, env: dict[str, str], since: float) -> list[dict[str, Any]]:
    """``icefloe tables --json`` once both tables hold everything the stream does."""
    while True:
        rows = tables_json(data, env)
        if (
            len(rows) == 2
            and all(r["lag_records"] == 0 for r in rows)
            and len({r["commit"] for r in rows}) == 1
        ):
            return rows
        assert time.monotonic() - since < CATCH_UP_S, f"the tables did not catch up: {rows}"
        time.sleep(1)
