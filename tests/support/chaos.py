"""Faults and workloads for chaos runs: brokers killed while real clients produce and consume,
and the checks that what was acknowledged is in the stream and both tables exactly once.

A run records every outcome the clients report — each record's acknowledged partition and
offset, or its error — and, after the faults stop and the cluster settles, reads everything
back: through Kafka (every partition from its start) and through both tables. The checks say
what went wrong record by record, so a failure names the records and offsets to look at.

Used by the short runs in the suite (tests/integration/test_chaos.py) and the long ones run by
hand (``python -m tests.chaos``).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from tests.support.broker import RunningIcefloe, broker_pids
from tests.support.servers import ServerProcess
from tests.support.table_readers import delta_rows, iceberg_rows
from tests.support.tables_cli import tables_json

VALUE_PAD = b"." * 64
"""Each record's value is its name and this padding: records of a realistic size."""


def client_logger(path: Path) -> logging.Logger:
    """A logger writing the clients' own log lines to ``path`` (not the test's output)."""
    logger = logging.getLogger(f"chaos-clients-{path}")
    logger.propagate = False
    if not logger.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger


def record_name(value: bytes) -> str:
    return value.split(b"|", 1)[0].decode()


def _sequence_of(name: str) -> tuple[str, int]:
    producer, number = name.rsplit("-", 1)
    return producer, int(number)


# --- faults ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Kill:
    at: float
    """Seconds since the run started."""
    pid: int
    what: str


class BrokerKiller(threading.Thread):
    """SIGKILLs one of ``serve``'s broker processes, chosen at random, every ``every`` seconds
    (a range), and checks that each really died: a run whose faults did not happen proves
    nothing."""

    def __init__(
        self,
        running: RunningIcefloe,
        every: tuple[float, float],
        started: float,
        seed: int,
    ) -> None:
        super().__init__(name="broker-killer", daemon=True)
        self._running = running
        self._every = every
        self._began = started
        self._random = random.Random(seed)
        self._stopping = threading.Event()
        self.kills: list[Kill] = []
        self.failures: list[str] = []

    def run(self) -> None:
        while not self._stopping.wait(self._random.uniform(*self._every)):
            pids = broker_pids(self._running)
            if not pids:
                continue  # serve is restarting them all
            pid = self._random.choice(pids)
            at = time.monotonic() - self._began
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
            if not process_gone(pid, 10.0):
                self.failures.append(f"broker {pid} was still alive 10 s after SIGKILL")
            self.kills.append(Kill(at, pid, "broker"))

    def stop(self) -> None:
        self._stopping.set()
        self.join()


class StoreFaults(threading.Thread):
    """Kills (SIGKILL, then a restart on its data after ``down_s``) and pauses (SIGSTOP for
    ``pause_s``, longer than the sessions' TTL) a metadata server in turn, one fault every
    ``every`` seconds (a range), checking that each happened."""

    def __init__(
        self,
        server: ServerProcess,
        every: tuple[float, float],
        started: float,
        seed: int,
        down_s: float = 3.0,
        pause_s: float = 15.0,
    ) -> None:
        super().__init__(name="store-faults", daemon=True)
        self._server = server
        self._every = every
        self._began = started
        self._random = random.Random(seed)
        self._down_s = down_s
        self._pause_s = pause_s
        self._stopping = threading.Event()
        self.kills: list[Kill] = []
        self.failures: list[str] = []

    def run(self) -> None:
        n = 0
        while not self._stopping.wait(self._random.uniform(*self._every)):
            at = time.monotonic() - self._began
            process = self._server.process
            assert process is not None
            if n % 2 == 0:
                self._server.kill()
                if process.poll() is None:
                    self.failures.append(f"{self._server.name} survived SIGKILL")
                time.sleep(self._down_s)
                self._server.start()
                self.kills.append(Kill(at, process.pid, f"{self._server.name} killed"))
            else:
                self._server.pause()
                if not process_stopped(process.pid):
                    self.failures.append(f"{self._server.name} did not stop on SIGSTOP")
                time.sleep(self._pause_s)
                self._server.resume()
                self.kills.append(Kill(at, process.pid, f"{self._server.name} paused"))
            n += 1

    def stop(self) -> None:
        self._stopping.set()
        self.join()


def process_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state T)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if _state(pid) == "T":
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def process_gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` has died (a zombie counts: it is no longer running)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if _state(pid) in (None, "Z", "X"):
            return True
        time.sleep(0.05)
    return False


def wait_for_brokers(running: RunningIcefloe, count: int, within: float = 90.0) -> None:
    """Wait until ``serve`` runs ``count`` brokers again, each accepting connections."""
    from tests.support.servers import port_open

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if len(broker_pids(running)) == count and all(
            port_open(running.port + i) for i in range(count)
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"serve did not run {count} brokers again within {within:.0f} s")


# --- workloads ------------------------------------------------------------------------------


@dataclass
class Outcomes:
    """What a producer's client reported of each record it sent."""

    acked: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    """Record name → (partition, offset) the broker acknowledged (``None``: acknowledged by a
    later batch's acknowledgement, see :func:`check_stream`)."""
    failed: dict[str, str] = field(default_factory=dict)
    """Record name → the error the client reported (the record may or may not be written)."""
    sent: list[tuple[str, int]] = field(default_factory=list)
    """(record name, partition) in the order the application produced them."""


class IdempotentLoad(threading.Thread):
    """An idempotent producer (acks=all) sending numbered records round-robin over the topic's
    partitions at a steady rate until stopped, then waiting for every outcome."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        name: str,
        rate: float,
        logger: logging.Logger,
        config: dict[str, object] | None = None,
    ) -> None:
        super().__init__(name=f"load-{name}", daemon=True)
        self.topic = topic
        self.partitions = partitions
        self.producer_name = name
        self._rate = rate
        self._stopping = threading.Event()
        self.outcomes = Outcomes()
        self.unfinished = 0
        """Records still without an outcome when the producer gave up waiting."""
        self.fatal: str | None = None
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "client.id": name,
                "logger": logger,
                **(config or {}),
            }
        )

    def run(self) -> None:
        interval = 1 / self._rate
        next_at = time.monotonic()
        n = 0
        while not self._stopping.is_set():
            name = f"{self.producer_name}-{n:09d}"
            partition = n % self.partitions
            self._send(name, partition)
            n += 1
            next_at += interval
            pause = next_at - time.monotonic()
            if pause > 0:
                self._stopping.wait(pause)
            self._producer.poll(0)
        self.unfinished = self._producer.flush(300)

    def _send(self, name: str, partition: int) -> None:
        def delivered(err: KafkaError | None, message: object) -> None:
            if err is not None:
                self.outcomes.failed[name] = str(err)
                if err.fatal() and self.fatal is None:
                    self.fatal = str(err)
            else:
                self.outcomes.acked[name] = (message.partition(), message.offset())  # type: ignore[attr-defined]

        value = name.encode() + b"|" + VALUE_PAD
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value=value,
                    key=name.encode(),
                    partition=partition,
                    on_delivery=delivered,
                )
                break
            except BufferError:  # the client's queue is full: let it drain
                self._producer.poll(0.1)
        self.outcomes.sent.append((name, partition))

    def stop(self) -> None:
        self._stopping.set()
        self.join()


@dataclass(frozen=True, slots=True)
class Handed:
    """A record handed to a member of a group."""

    name: str
    partition: int
    offset: int
    member: int
    at: float
    """Seconds since the members started."""


class GroupReaders:
    """Members of one consumer group reading a topic while faults happen, committing what
    they processed; every record each member was handed is noted."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        members: int,
        protocol: str,
        logger: logging.Logger,
    ) -> None:
        self._stopping = threading.Event()
        self.seen: list[Handed] = []
        """Every record a member was handed, in order."""
        self._began = time.monotonic()
        self._lock = threading.Lock()
        self.errors: list[str] = []
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "logger": logger,
        }
        if protocol == "consumer":
            config["group.protocol"] = "consumer"
        else:
            config["partition.assignment.strategy"] = "cooperative-sticky"
        self._threads = [
            threading.Thread(
                target=self._member, args=(config, topic, i), name=f"{group}-{i}", daemon=True
            )
            for i in range(members)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _member(self, config: dict[str, object], topic: str, index: int) -> None:
        consumer = Consumer({**config, "client.id": f"member-{index}"})
        consumer.subscribe([topic])
        try:
            while not self._stopping.is_set():
                for message in consumer.consume(500, 0.5):
                    error = message.error()
                    if error is not None:
                        if error.fatal():
                            self.errors.append(str(error))
                        continue
                    handed = Handed(
                        record_name(message.value()),
                        message.partition(),
                        message.offset(),
                        index,
                        time.monotonic() - self._began,
                    )
                    with self._lock:
                        self.seen.append(handed)
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(60)


# --- checks ---------------------------------------------------------------------------------


def read_stream(
    bootstrap: str, topic: str, partitions: int, within: float = 120.0
) -> dict[int, list[tuple[int, str]]]:
    """Every record of every partition, from its start to its end now: partition →
    [(offset, record name)] in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-check",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        ends = {p: _watermarks(consumer, TopicPartition(topic, p)) for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, ends[p][0]) for p in range(partitions)])
        stream: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
        done = {p for p, (low, high) in ends.items() if low >= high}
        deadline = time.monotonic() + within
        while len(done) < partitions:
            assert time.monotonic() < deadline, (
                f"could not read the stream back within {within:.0f} s: "
                f"{ {p: len(stream[p]) for p in stream} } of {ends}"
            )
            for message in consumer.consume(1000, 0.5):
                p = message.partition()
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        if message.offset() >= ends[p][1]:
                            done.add(p)
                        continue
                    raise AssertionError(f"reading the stream back: {message.error()}")
                if message.offset() < ends[p][1]:
                    stream[p].append((message.offset(), record_name(message.value())))
                if message.offset() >= ends[p][1] - 1:
                    done.add(p)
        return stream
    finally:
        consumer.close()


def _watermarks(consumer: Consumer, partition: TopicPartition) -> tuple[int, int]:
    """The partition's log start and end, once the client knows the partition (a client
    started right after the cluster may not, for a moment)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            low, high = consumer.get_watermark_offsets(partition, timeout=10)
            return low, high
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@dataclass
class Verdict:
    """What a check found; empty lists mean the guarantee held."""

    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    misplaced: list[str] = field(default_factory=list)
    reordered: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [*self.lost, *self.duplicated, *self.misplaced, *self.reordered]

    def summary(self) -> str:
        return (
            f"{len(self.lost)} lost, {len(self.duplicated)} duplicated, "
            f"{len(self.misplaced)} at other offsets than acknowledged, "
            f"{len(self.reordered)} out of order"
        )


def check_stream(
    stream: dict[int, list[tuple[int, str]]], loads: Sequence[IdempotentLoad]
) -> Verdict:
    """Every acknowledged record once, at the offset it was acknowledged with; each
    producer's records of a partition in the order it sent them; nothing twice.

    A record acknowledged without an offset is one librdkafka took as written because the
    broker acknowledged a later batch of its producer on that partition (a broker writes an
    idempotent producer's batches in order): it must be there all the same."""
    verdict = Verdict()
    where: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for partition, records in stream.items():
        for offset, name in records:
            where[name].append((partition, offset))
    for name, places in where.items():
        if len(places) > 1:
            verdict.duplicated.append(f"{name} at {places}")
    for load in loads:
        for name, acked in load.outcomes.acked.items():
            places = where.get(name, [])
            if not places:
                verdict.lost.append(f"{name} (acknowledged at {acked})")
            elif acked[1] is not None and acked not in places:
                verdict.misplaced.append(f"{name} acknowledged at {acked}, found at {places}")
    for partition, records in stream.items():
        last: dict[str, tuple[int, int]] = {}
        for offset, name in records:
            producer, number = _sequence_of(name)
            before = last.get(producer)
            if before is not None and number < before[1]:
                verdict.reordered.append(
                    f"partition {partition}: {name} at offset {offset} after "
                    f"{producer}-{before[1]:09d} at offset {before[0]}"
                )
            last[producer] = (offset, max(number, before[1] if before else -1))
    return verdict


def check_group(
    readers: GroupReaders, stream: dict[int, list[tuple[int, str]]]
) -> tuple[list[str], int]:
    """Records of the stream the group was never handed (at-least-once), and how many it
    was handed more than once (redeliveries after rebalances, which at-least-once allows)."""
    handed = Counter(h.name for h in readers.seen)
    missed = [
        f"{name} at {partition}/{offset}"
        for partition, records in stream.items()
        for offset, name in records
        if handed[name] == 0
    ]
    return missed, sum(count - 1 for count in handed.values() if count > 1)


def redeliveries(readers: GroupReaders) -> list[str]:
    """Each run of offsets of a partition handed again, with when and to whom: what a
    rebalance or a lost commit made the group read twice."""
    first: dict[tuple[int, int], Handed] = {}
    again: list[Handed] = []
    for h in readers.seen:
        if (h.partition, h.offset) in first:
            again.append(h)
        else:
            first[(h.partition, h.offset)] = h
    runs: list[list[Handed]] = []
    for h in sorted(again, key=lambda h: (h.partition, h.at, h.offset)):
        last = runs[-1][-1] if runs else None
        if (
            last
            and (last.partition, last.member) == (h.partition, h.member)
            and (h.offset == last.offset + 1 or h.at - last.at < 1)
        ):
            runs[-1].append(h)
        else:
            runs.append([h])
    lines = []
    for run in runs:
        start, end = run[0], run[-1]
        before = first[(start.partition, start.offset)]
        lines.append(
            f"partition {start.partition} offsets {start.offset}-{end.offset} "
            f"({len(run)} records) again to member {start.member} at {start.at:.1f} s, "
            f"first to member {before.member} at {before.at:.1f} s"
        )
    return lines


def caught_up_tables(
    running: RunningIcefloe, topic: str, give_up_s: float, env: dict[str, str]
) -> bool:
    """Wait until compaction has caught up with the topic in both tables; whether it did
    within ``give_up_s`` seconds. ``env`` configures the cluster (its metadata store)."""
    deadline = time.monotonic() + give_up_s
    while time.monotonic() < deadline:
        rows = [r for r in tables_json(running.data_dir, env) if r["topic"] == topic]
        if rows and all(r["lag_records"] == 0 for r in rows):
            return True
        time.sleep(1)
    return False


def table_rows(
    running: RunningIcefloe,
    topic: str,
    env: dict[str, str],
    engine_options: dict[str, str] | None = None,
    iceberg_properties: dict[str, str] | None = None,
) -> dict[str, list[object]]:
    """Both tables' rows, through pyiceberg and delta-rs (given what they need to reach the
    object store, where it is not the local one)."""
    listed = tables_json(running.data_dir, env)
    by_format = {r["format"]: r for r in listed if r["topic"] == topic}
    assert set(by_format) == {"iceberg", "delta"}, f"icefloe tables lists {listed}"
    catalog = running.data_dir / "iceberg-catalog.db"
    identifier = by_format["iceberg"]["identifier"]
    return {
        "iceberg": list(iceberg_rows(identifier, catalog, iceberg_properties or {})),
        "delta": list(delta_rows(by_format["delta"]["location"], engine_options or {})),
    }


def check_tables(
    tables: dict[str, list[object]], stream: dict[int, list[tuple[int, str]]]
) -> dict[str, list[str]]:
    """Per table format, how its rows differ from the stream (each record once, at its
    offset)."""
    expected = Counter(
        (partition, offset, name)
        for partition, records in stream.items()
        for offset, name in records
    )
    differences: dict[str, list[str]] = {}
    for table_format, rows in tables.items():
        found = Counter(
            (row[0], row[1], record_name(row[3]))  # type: ignore[index]
            for row in rows
        )
        missing = expected - found
        extra = found - expected
        differences[table_format] = [f"missing {r}" for r in sorted(missing)][:20] + [
            f"extra {r}" for r in sorted(extra)
        ][:20]
    return differences


def report(
    title: str,
    seconds: float,
    kills: Iterable[Kill],
    loads: Sequence[IdempotentLoad],
    verdict: Verdict,
    extra: Callable[[], str] | None = None,
) -> str:
    acked = sum(len(load.outcomes.acked) for load in loads)
    failed = sum(len(load.outcomes.failed) for load in loads)
    kills = list(kills)
    lines = [
        f"{title}: {seconds:.0f} s, {len(kills)} kills, {acked} records acknowledged, "
        f"{failed} failed, stream: {verdict.summary()}",
    ]
    if extra is not None:
        lines.append(extra())
    return "\n".join(lines)
