"""A transactional consume-transform-produce pipeline: members of one consumer group, each a
process of its own (:mod:`tests.support.eos_worker`), and what tests do to it: members join,
leave, pause and die while inputs arrive at a steady pace; then the proof that every input
came out exactly once, read with read_committed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kio.schema.errors import ErrorCode
from kio.static.primitive import i32

from icefloe.broker.protocol import make
from tests.support import admin_wire
from tests.support.servers import ROOT


class PipelineWorker:
    """One worker process and the events it printed."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        transactional_id: str,
        protocol: str,
        topics: tuple[str, str],
        log_dir: Path,
        pause_at: str | None = None,
        transaction_timeout_ms: int | None = None,
    ) -> None:
        self.transactional_id = transactional_id
        self.log_path = log_dir / f"{transactional_id}-{time.monotonic_ns()}.log"
        command = [sys.executable, "-m", "tests.support.eos_worker", bootstrap, group]
        command += [transactional_id, protocol, *topics]
        if pause_at:
            command += ["--pause-at", pause_at]
        if transaction_timeout_ms:
            command += ["--transaction-timeout-ms", str(transaction_timeout_ms)]
        self.command = command
        self.events: list[dict[str, Any]] = []
        self.process: subprocess.Popen[str] | None = None
        self.killed = False
        """Killed by the test: its exit status says nothing of it."""
        self.hung_closing = False
        """Killed after its work was done, its client's close still waiting on the group."""
        self.stuck_stopping: str | None = None
        """Killed because it did not stop in time: the step it was in (its last event)."""
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None

    def start(self) -> PipelineWorker:
        with self.log_path.open("w") as log:  # librdkafka's logs, and a crash's traceback
            self.process = subprocess.Popen(
                self.command,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.process is not None
        assert self.process.stdout is not None
        with self.log_path.with_suffix(".events").open("w") as kept:  # for a post-mortem
            for line in self.process.stdout:
                kept.write(line)
                kept.flush()
                with self._lock:
                    self.events.append(json.loads(line))

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def events_copy(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.events)

    def seen(self, event: str, **match: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [
                e
                for e in self.events
                if e["event"] == event and all(e.get(k) == v for k, v in match.items())
            ]

    def wait_for(self, event: str, timeout: float = 120, **match: Any) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self.seen(event, **match):
            assert self.alive() or self.seen(event, **match), (
                f"{self.transactional_id} exited before {event} {match}: {self.describe()}"
            )
            assert time.monotonic() < deadline, (
                f"{self.transactional_id} printed no {event} {match} in {timeout} s: "
                f"{self.describe()}"
            )
            time.sleep(0.05)
        return self.seen(event, **match)[0]

    def describe(self) -> str:
        """Its last events and the end of its log, for a failure's message."""
        code = self.process.returncode if self.process else None
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        return f"exit {code}, last events {self.events[-6:]}, log: {log}"

    def owned(self) -> set[int]:
        """The partitions it owns now, by its rebalance events."""
        owned: set[int] = set()
        with self._lock:
            for e in self.events:
                if e["event"] == "assigned":
                    owned |= set(e["partitions"])
                elif e["event"] in ("revoked", "lost"):
                    owned -= set(e["partitions"])
        return owned

    def signal(self, number: signal.Signals) -> None:
        os.kill(self.pid, number)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.killed = True
        assert self.process is not None
        self.process.wait(30)

    def ending(self) -> str:
        """How the process ended, or that it runs."""
        code = None if self.process is None else self.process.poll()
        if code is None:
            return "running"
        if self.killed:
            return "killed by the test"
        if self.hung_closing:
            return "its close outlasted its work by 30 s: killed"
        if self.stuck_stopping is not None:
            return f"did not stop after SIGTERM, its last event {self.stuck_stopping}: killed"
        if code == 0:
            return "stopped"
        log = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        error = [line for line in log.splitlines() if line and not line.startswith(("%", " "))]
        return f"crashed (exit {code}): {error[-1] if error else 'no error in its log'}"

    def exit_code(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    def stop(self, timeout: float = 120, closing_s: float = 30) -> int:
        """SIGTERM: it commits its transaction, leaves the group and exits 0; its exit status.

        One still in the client's close ``closing_s`` after it began is killed (-9), and
        ``hung_closing`` says so: leaving the group is not the pipeline's work."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused member must wake to stop
            self.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.process.poll() is None and time.monotonic() < deadline:
                closing = self.seen("closing")
                if closing and time.time() - closing[0]["t"] > closing_s:
                    self.hung_closing = True
                    break
                time.sleep(0.1)
            if self.process.poll() is None:
                if not self.hung_closing:
                    last = self.events_copy()[-1:] or [{"event": "nothing"}]
                    self.stuck_stopping = ", ".join(
                        f"{k} {v}" for k, v in last[0].items() if k != "t"
                    )
                self.process.kill()  # did not stop: its exit status says so
                self.process.wait()
        if self._reader is not None:
            self._reader.join(10)
        return self.process.returncode


class InputFeed(threading.Thread):
    """Produces ``str(i)`` for i in range(count) to the input, spread over ``seconds``,
    partition ``i % partitions``, each exactly once whatever brokers die: a chunk at a time in
    a transaction, a chunk whose transaction fails produced again in the next."""

    CHUNK = 50

    def __init__(
        self, bootstrap: str, topic: str, count: int, partitions: int, seconds: float
    ) -> None:
        super().__init__(name="input feed", daemon=True)
        self.bootstrap, self.topic, self.count = bootstrap, topic, count
        self.partitions, self.seconds = partitions, seconds
        self.error: str | None = None
        self.produced = 0
        self.retried_chunks = 0

    def run(self) -> None:
        try:
            self._feed()
        except Exception as exc:  # noqa: BLE001 - reported to the test through .error
            self.error = repr(exc)

    def _feed(self) -> None:
        producer = self._producer()
        started = time.monotonic()
        while self.produced < self.count:
            chunk = range(self.produced, min(self.produced + self.CHUNK, self.count))
            producer.begin_transaction()
            for i in chunk:
                value = str(i).encode()
                producer.produce(self.topic, key=value, value=value, partition=i % self.partitions)
            if _committed(producer):
                self.produced = chunk.stop
            else:
                self.retried_chunks += 1
            ahead = started + self.seconds * self.produced / self.count - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    def _producer(self) -> Producer:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "transactional.id": f"input-feed-{self.topic}",
                "linger.ms": 5,
            }
        )
        producer.init_transactions(60)
        return producer


def _committed(producer: Producer) -> bool:
    """Commit as an application should: retry what may be retried, abort what must be."""
    for _ in range(20):
        try:
            producer.commit_transaction(30)
            return True
        except KafkaException as exc:
            error = exc.args[0]
            if error.retriable():
                continue
            if error.txn_requires_abort():
                producer.abort_transaction(60)
                return False
            raise
    raise AssertionError("the input feed's commit kept failing")


T = TypeVar("T")


def patiently(read: Callable[[], T], attempts: int = 10) -> T:
    """``read()``, again after a client error: the broker it asked may just have been killed."""
    for attempt in range(attempts):
        try:
            return read()
        except KafkaException:
            if attempt == attempts - 1:
                raise
            time.sleep(1)
    raise AssertionError("unreachable")


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> list[int]:
    """The group's stable committed offsets (a pending transaction makes this wait)."""

    def read() -> list[int]:
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            wanted = [TopicPartition(topic, p) for p in range(partitions)]
            return [tp.offset for tp in consumer.committed(wanted, timeout=30)]
        finally:
            consumer.close()

    return patiently(read)


def log_ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    def read() -> list[int]:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "log-ends",
                "isolation.level": "read_uncommitted",
            }
        )
        try:
            return [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)
            ]
        finally:
            consumer.close()

    return patiently(read)


def read_committed(
    bootstrap: str, topic: str, partitions: int, timeout: float = 120
) -> list[bytes]:
    """Every value of ``topic`` a read_committed consumer reads, up to the log end as it is when
    the read begins (every transaction before it must have ended for the read to get there)."""
    return [value for _, _, value in _read(bootstrap, topic, partitions, timeout)]


def record_ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    """Per partition, the offset after its last committed record: where a consumer that read
    everything has its position (transaction markers take offsets too, so this may be short of
    the log end)."""
    ends = [0] * partitions
    for partition, offset, _ in _read(bootstrap, topic, partitions, 120):
        ends[partition] = max(ends[partition], offset + 1)
    return ends


def _read(
    bootstrap: str, topic: str, partitions: int, timeout: float
) -> list[tuple[int, int, bytes]]:
    ends = log_ends(bootstrap, topic, partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"verify-{time.monotonic_ns()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    at = [-1] * partitions
    records: list[tuple[int, int, bytes]] = []
    deadline = time.monotonic() + timeout
    try:
        while any(a < e for a, e in zip(at, ends, strict=True)):
            assert time.monotonic() < deadline, f"read to {at} of {ends}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at[message.partition()] = message.offset()
                continue
            records.append((message.partition(), message.offset(), message.value()))
    finally:
        consumer.close()
    return records


def wait_until(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.2)


def wait_until_consumed(
    bootstrap: str, group: str, topic: str, partitions: int, timeout: float = 180
) -> None:
    """Until the group's committed offsets are past every record of the input (once the feed
    is done)."""
    ends = record_ends(bootstrap, topic, partitions)
    wait_until(
        lambda: committed(bootstrap, group, topic, partitions) == ends,
        f"group {group} committed offsets {ends}",
        timeout,
    )


@dataclass(frozen=True)
class Tally:
    """What the outputs hold of ``inputs`` inputs."""

    outputs: int
    missing: list[int]
    repeated: dict[int, int]
    strange: list[bytes]

    @property
    def exactly_once(self) -> bool:
        return not (self.missing or self.repeated or self.strange)


def tally(values: Iterable[bytes], inputs: int, prefix: str = "out-") -> Tally:
    """Input ``i`` comes out as ``prefix`` and ``i``."""
    values = list(values)
    counts = Counter(values)
    expected = {f"{prefix}{i}".encode(): i for i in range(inputs)}
    return Tally(
        outputs=len(values),
        missing=[i for v, i in expected.items() if v not in counts],
        repeated={expected[v]: n for v, n in counts.items() if v in expected and n > 1},
        strange=[v for v in counts if v not in expected],
    )


def transaction_state(bootstrap: str, transactional_id: str) -> str:
    """The transaction's state as DescribeTransactions gives it (Ongoing, CompleteCommit, …)."""
    m = admin_wire.module(65, 0)
    response = admin_wire.call(
        bootstrap, make(m.DescribeTransactionsRequest, transactional_ids=(transactional_id,))
    )
    (state,) = response.transaction_states
    return str(state.transaction_state)


def unstable_partitions(bootstrap: str, group: str, topic: str, partitions: int) -> set[int]:
    """The partitions OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT."""
    m = admin_wire.module(9, 8)
    wanted = make(
        m.OffsetFetchRequestGroup,
        group_id=group,
        topics=(
            make(
                m.OffsetFetchRequestTopics,
                name=topic,
                partition_indexes=tuple(i32(p) for p in range(partitions)),
            ),
        ),
    )
    response = admin_wire.call(
        bootstrap, make(m.OffsetFetchRequest, groups=(wanted,), require_stable=True)
    )
    return {
        int(p.partition_index)
        for g in response.groups
        for t in g.topics
        for p in t.partitions
        if p.error_code is ErrorCode.unstable_offset_commit
    }
