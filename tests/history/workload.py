"""The clients of a history run, each recording every operation it performs.

A *key* is a partition of the run's topic (``"topic/partition"``); every value written to a key
is an integer no other write to that key uses, so a read says exactly which write it saw.

- :class:`Sender`: an idempotent producer (acks=all), one record per ``send`` operation.
- :class:`Poller`: a member of a consumer group (read_committed), one ``poll`` per operation,
  committing what it read; its rebalances are ``assign`` operations.
- :class:`Transactor`: consume-transform-produce in transactions: each ``txn`` polls what its
  group assigned it, sends a few values, commits its read position with the transaction
  (``send_offsets_to_transaction``), and commits, or now and then aborts.
- :func:`final_read`: after the faults, every key read from its start by a fresh client.

Every client takes its configuration, topic and values from one :class:`Setup`. A client
whose outcome became unknown (a timeout, a fatal error) is closed and replaced by a new one
under a new process number, as the history format requires.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Final

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from tests.history.recorder import FAIL, INFO, OK, Completed, History

SEND_TIMEOUT_S: Final = 30.0
"""A send without an answer for this long is recorded as unknown (``info``)."""
TRANSACTION_TIMEOUT_MS: Final = 15_000
"""A transaction left open by a replaced client is aborted by the broker after this."""
SESSION_TIMEOUT_MS: Final = 10_000
ABORT_ONE_IN: Final = 8
"""A transactor aborts about one transaction in this many on purpose."""


def key(topic: str, partition: int) -> str:
    return f"{topic}/{partition}"


class Values:
    """Hands out values unique per key over the whole run (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}

    def next(self, for_key: str) -> int:
        with self._lock:
            value = self._next.get(for_key, 0)
            self._next[for_key] = value + 1
            return value


@dataclass(frozen=True)
class Setup:
    """What every client of a run shares."""

    history: History
    client: dict[str, Any]
    """Client configuration: the bootstrap servers and a logger for the clients' own lines."""
    topic: str
    partitions: int
    values: Values


KNOWN_CLIENT_HANG: Final = "send_offsets_to_transaction"
KNOWN_CLIENT_HANG_WHY: Final = (
    "librdkafka waits on a group coordinator that left the cluster's metadata and ignores the "
    "call's timeout: confluentinc/librdkafka#5456, #5511"
)


class Worker(threading.Thread):
    """A client thread: performs operations until stopped, replacing its client when an
    outcome is unknown."""

    def __init__(self, name: str, setup: Setup, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.history = setup.history
        self.client = setup.client
        self.topic = setup.topic
        self.partitions = setup.partitions
        self.values = setup.values
        self.random = random.Random(seed)
        self.stopping = threading.Event()
        self.errors: list[str] = []
        """Errors of the worker itself (not of operations): a bug of the run, not an anomaly."""
        self.client_hangs: list[str] = []
        """Client calls that outlived their timeout by far, in a known defect of the client."""
        self.process = -1
        """The history's number for the current client."""
        self.replaced = 0
        """Clients replaced after an operation with an unknown outcome."""

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.process = self.history.new_process()
                self.session()
        except Exception as exc:  # a bug in the run: reported, never hidden
            self.errors.append(f"{self.name}: {exc!r}")
            raise

    def session(self) -> None:
        """Run one client until stopped or until its outcome became unknown."""
        raise NotImplementedError

    def done(
        self,
        f: str,
        invoked: float,
        invoke_value: Any,
        type: str,
        value: Any,
        error: str | None = None,
    ) -> None:
        now = self.history.now()
        self.history.record(
            Completed(self.process, f, invoked, invoke_value, now, type, value, error)
        )

    def stop(self) -> None:
        self.stopping.set()
        self.join(120)
        if self.is_alive():
            frame = sys._current_frames().get(self.ident or 0)
            where = "".join(traceback.format_stack(frame)[-3:]) if frame else "?"
            stuck = f"{self.name} did not stop within 120 s, at:\n{where}"
            if KNOWN_CLIENT_HANG in where:
                self.client_hangs.append(f"{stuck}({KNOWN_CLIENT_HANG_WHY})")
            else:
                self.errors.append(stuck)


class Sender(Worker):
    """One record per operation, waiting for its acknowledgement."""

    def __init__(self, name: str, setup: Setup, seed: int) -> None:
        super().__init__(name, setup, seed)
        self._config: dict[str, Any] = {
            **setup.client,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "delivery.timeout.ms": int(SEND_TIMEOUT_S * 1000),
            "client.id": name,
        }

    def session(self) -> None:
        producer = Producer(self._config)
        try:
            while not self.stopping.is_set():
                if not self._send(producer):
                    self.replaced += 1
                    return
        finally:
            producer.flush(5)

    def _send(self, producer: Producer) -> bool:
        partition = self.random.randrange(self.partitions)
        k = key(self.topic, partition)
        value = self.values.next(k)
        invoked = self.history.now()
        outcome = send_and_wait(producer, self.topic, partition, str(value).encode())
        invoke = [["send", k, value]]
        if outcome is None:
            self.done("send", invoked, invoke, INFO, invoke)
            return False
        error, message = outcome
        if error is None:
            assert message is not None
            self.done("send", invoked, invoke, OK, [["send", k, [message.offset(), value]]])
            return True
        # An idempotent producer that gave up on a record cannot say whether it was written.
        self.done("send", invoked, invoke, INFO, invoke, error=str(error))
        return False


def send_and_wait(
    producer: Producer, topic: str, partition: int, value: bytes, record_key: bytes | None = None
) -> tuple[KafkaError | None, Message | None] | None:
    """Produce one record and wait for its delivery report: ``(error, message)``, or ``None``
    when none came within the send timeout (and a little more)."""
    outcome: list[tuple[KafkaError | None, Message | None]] = []
    producer.produce(
        topic,
        value,
        record_key,
        partition=partition,
        on_delivery=lambda err, msg: outcome.append((err, msg)),
    )
    deadline = time.monotonic() + SEND_TIMEOUT_S + 5
    while not outcome and time.monotonic() < deadline:
        producer.poll(0.05)
    return outcome[0] if outcome else None


class _Assignments:
    """Notes a consumer's rebalances, which happen inside its poll calls."""

    def __init__(self, topic: str, history: History) -> None:
        self.topic = topic
        self.history = history
        self.changes: list[tuple[float, list[str]]] = []
        self.current: set[int] = set()

    # The client assigns (or incrementally assigns) the partitions itself after these.
    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.current |= {tp.partition for tp in partitions}
        self._changed()

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.current -= {tp.partition for tp in partitions}
        self._changed()

    def _changed(self) -> None:
        keys = [key(self.topic, p) for p in sorted(self.current)]
        self.changes.append((self.history.now(), keys))

    def take(self) -> list[tuple[float, list[str]]]:
        changes, self.changes = self.changes, []
        return changes


def _reads(topic: str, messages: list[Message]) -> dict[str, list[list[int]]]:
    reads: dict[str, list[list[int]]] = {}
    for message in messages:
        reads.setdefault(key(topic, message.partition()), []).append(
            [message.offset(), int(message.value())]
        )
    return reads


def _group_consumer(client: dict[str, Any], group: str, name: str, protocol: str) -> Consumer:
    config: dict[str, Any] = {
        **client,
        "group.id": group,
        "client.id": name,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    if protocol == "consumer":
        config["group.protocol"] = "consumer"
    else:
        config["session.timeout.ms"] = SESSION_TIMEOUT_MS
        config["partition.assignment.strategy"] = "cooperative-sticky"
    return Consumer(config)


class Poller(Worker):
    """A consumer group member: each operation one poll, then a synchronous offset commit."""

    def __init__(self, name: str, setup: Setup, seed: int, group: str, protocol: str) -> None:
        super().__init__(name, setup, seed)
        self.group, self.protocol = group, protocol

    def session(self) -> None:
        consumer = _group_consumer(self.client, self.group, self.name, self.protocol)
        assignments = _Assignments(self.topic, self.history)
        consumer.subscribe(
            [self.topic], on_assign=assignments.on_assign, on_revoke=assignments.on_revoke
        )
        try:
            while not self.stopping.is_set():
                if not self._poll(consumer, assignments):
                    self.replaced += 1
                    return
        finally:
            consumer.close()

    def _poll(self, consumer: Consumer, assignments: _Assignments) -> bool:
        invoked = self.history.now()
        messages = consumer.consume(100, 0.2)
        records = [m for m in messages if m.error() is None]
        fatal = [m.error() for m in messages if m.error() is not None and m.error().fatal()]
        invoke = [["poll"]]
        # A rebalance inside the call: the poll saw nothing before it, the records after it.
        for at, keys in assignments.take():
            nothing = [["poll", {}]]
            self.history.record(Completed(self.process, "poll", invoked, invoke, at, OK, nothing))
            self.history.record(Completed(self.process, "assign", at, keys, at, OK, keys))
            invoked = at
        self.done("poll", invoked, invoke, OK, [["poll", _reads(self.topic, records)]])
        if fatal:
            return False
        return self._commit(consumer) if records else True

    def _commit(self, consumer: Consumer) -> bool:
        """Commit the position; ``False`` when the outcome is unknown (the client is replaced,
        as after any operation whose outcome is unknown)."""
        invoked = self.history.now()
        try:
            offsets = consumer.commit(asynchronous=False)
        except KafkaException as exc:
            # A refused commit (the partitions moved on) left the offsets as they were.
            definite = exc.args[0].code() in (
                KafkaError.REBALANCE_IN_PROGRESS,
                KafkaError.ILLEGAL_GENERATION,
                KafkaError.UNKNOWN_MEMBER_ID,
                KafkaError.STALE_MEMBER_EPOCH,
                KafkaError._NO_OFFSET,
            )
            self.done("commit", invoked, {}, FAIL if definite else INFO, {}, error=str(exc))
            return definite
        committed = {
            key(self.topic, tp.partition): tp.offset for tp in offsets or [] if tp.offset >= 0
        }
        self.done("commit", invoked, committed, OK, committed)
        return True


class Transactor(Worker):
    """Consume-transform-produce: poll, send, commit the read position with the transaction."""

    def __init__(self, name: str, setup: Setup, seed: int, group: str, protocol: str) -> None:
        super().__init__(name, setup, seed)
        self.group, self.protocol = group, protocol

    def session(self) -> None:
        producer = Producer(
            {
                **self.client,
                "transactional.id": self.name,
                "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                "client.id": self.name,
            }
        )
        consumer = _group_consumer(self.client, self.group, self.name, self.protocol)
        assignments = _Assignments(self.topic, self.history)
        try:
            producer.init_transactions(60)
            consumer.subscribe(
                [self.topic], on_assign=assignments.on_assign, on_revoke=assignments.on_revoke
            )
            while not self.stopping.is_set():
                if not self._transaction(producer, consumer, assignments):
                    self.replaced += 1
                    return
        except KafkaException:
            self.replaced += 1  # init_transactions failed: a new client tries again
        finally:
            consumer.close()
            with contextlib.suppress(KafkaException):  # fenced by its successor, say
                producer.flush(5)

    def _transaction(
        self, producer: Producer, consumer: Consumer, assignments: _Assignments
    ) -> bool:
        """One transaction; ``False`` when its outcome is unknown (the client is replaced)."""
        invoked = self.history.now()
        sends = [
            (p, self.values.next(key(self.topic, p)))
            for p in self.random.sample(range(self.partitions), self.random.randint(1, 3))
        ]
        invoke: list[list[Any]] = [["poll"]]
        invoke += [["send", key(self.topic, p), v] for p, v in sends]
        try:
            producer.begin_transaction()
            messages = consumer.consume(20, 0.2)
            records = [m for m in messages if m.error() is None]
            moved = assignments.take()
            # Partition → the offset its send was acknowledged at (the values one transaction
            # sends to different partitions may be equal).
            acked: dict[int, int] = {}
            for partition, value in sends:
                producer.produce(
                    self.topic,
                    str(value).encode(),
                    partition=partition,
                    on_delivery=lambda err, msg: (
                        acked.__setitem__(msg.partition(), msg.offset()) if err is None else None
                    ),
                )
            if moved or self.random.randrange(ABORT_ONE_IN) == 0:
                # A rebalance during the poll: what was read may belong to another member now.
                producer.abort_transaction(30)
                return self._aborted(consumer, invoked, invoke)
            assigned = consumer.assignment()
            if assigned:
                producer.send_offsets_to_transaction(
                    consumer.position(assigned), consumer.consumer_group_metadata(), 30
                )
            producer.commit_transaction(30)
            producer.poll(0)  # the sends' delivery reports, with their offsets
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.txn_requires_abort():
                try:
                    producer.abort_transaction(30)
                except KafkaException as failed:
                    self.done("txn", invoked, invoke, INFO, invoke, error=str(failed))
                    return False
                assignments.take()
                return self._aborted(consumer, invoked, invoke)
            self.done("txn", invoked, invoke, INFO, invoke, error=str(error))
            return False
        value: list[list[Any]] = [["poll", _reads(self.topic, records)]]
        value += [["send", key(self.topic, p), [acked.get(p), v]] for p, v in sends]
        self.done("txn", invoked, invoke, OK, value)
        return True

    def _aborted(self, consumer: Consumer, invoked: float, invoke: list[list[Any]]) -> bool:
        """Record the abort and go back to the group's committed offsets (as an application
        that aborts must, or it skips what it read): an ``assign``, which also stands for any
        rebalance during the transaction."""
        self.done("txn", invoked, invoke, FAIL, invoke)
        assigned = consumer.assignment()
        try:
            for tp in consumer.committed(assigned, 30) if assigned else []:
                consumer.seek(
                    TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0)
                )
        except KafkaException:
            return False  # the client cannot rewind: a new one starts from the committed offsets
        now = self.history.now()
        keys = [key(self.topic, tp.partition) for tp in assigned]
        self.history.record(Completed(self.process, "assign", now, keys, now, OK, keys))
        return True


def final_read(
    setup: Setup, within: float = 120.0
) -> tuple[dict[int, list[tuple[int, str]]], list[str]]:
    """Read every key from its start to its end (read_committed), as polls of a new process:
    partition → [(offset, value)] read, and the keys that could not be read to their end
    within ``within`` seconds."""
    history, topic, partitions = setup.history, setup.topic, setup.partitions
    stream: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
    process = history.new_process()
    consumer = Consumer(
        {
            **setup.client,
            "group.id": "history-final-read",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    unfinished = set(range(partitions))
    try:
        ends = {p: end_offset(consumer, TopicPartition(topic, p)) for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        now = history.now()
        keys = [key(topic, p) for p in range(partitions)]
        history.record(Completed(process, "assign", now, keys, now, OK, keys))
        unfinished = {p for p in unfinished if ends[p] > 0}
        deadline = time.monotonic() + within
        while unfinished and time.monotonic() < deadline:
            invoked = history.now()
            messages = consumer.consume(1000, 0.5)
            records = [m for m in messages if m.error() is None]
            reads = [["poll", _reads(topic, records)]]
            history.record(
                Completed(process, "poll", invoked, [["poll"]], history.now(), OK, reads)
            )
            for m in records:
                stream[m.partition()].append((m.offset(), m.value().decode()))
            for m in messages:
                eof = m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF
                if (eof and m.offset() >= ends[m.partition()]) or (
                    m.error() is None and m.offset() >= ends[m.partition()] - 1
                ):
                    unfinished.discard(m.partition())
    finally:
        consumer.close()
    return stream, [key(topic, p) for p in sorted(unfinished)]


def end_offset(consumer: Consumer, partition: TopicPartition) -> int:
    """The partition's end offset, asked again while the cluster cannot answer (60 s)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return int(consumer.get_watermark_offsets(partition, timeout=10)[1])
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
