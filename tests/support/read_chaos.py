"""A seeded random driver of transactional and plain producers, compaction, log compaction and
consumers against one Icefloe, every read checked against :mod:`tests.support.read_model`.

Each episode creates a ``compact,delete`` topic and a plain ``delete`` one (a partition each)
and runs random actions on them, one at a time:

- a transactional producer (one of several) writes records into its transaction, to either
  topic or both, keys drawn from a few so that they repeat, some values null (tombstones) and
  some timestamps days old (tombstones past ``delete.retention.ms``);
- a transactional producer commits or aborts;
- a plain producer writes;
- in-process only (:class:`InProcessIcefloe`): compaction to Parquet, a log-cleaning pass or a
  merge of small files, waited for or left running in the background while the next actions
  (writes, transaction ends, a read) go on;
- a consumer (confluent-kafka, or kafka-python, whose read_committed logic is the Java
  client's) reads one partition from a random offset with either isolation level, with a
  per-partition fetch limit of one batch, a few hundred bytes or a megabyte, until it reaches
  the partition's end (the last stable offset for read_committed); the records it returned
  and where it stopped are checked against the model, and so is ListOffsets' answer.

Against ``icefloe serve`` (:class:`ServedIcefloe`) the broker's own compactor runs whenever it
likes (quick settings), and the model lets every read assume that a cleaning may have just run.

A failure names the seed, the episode and the actions that led to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import random
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonPartition

from icefloe.broker.broker import Broker
from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.read_model import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Model,
    Outcome,
    Seen,
    Transaction,
    problems_text,
)

T = TypeVar("T")
KEYS = [b"k%d" % i for i in range(5)]
TRANSACTIONAL_PRODUCERS = 3
DAY_MS = 86_400_000
FETCH_LIMITS = (1, 300, 1 << 20)
"""Per-partition fetch limits of the consumers: one batch a fetch, a few, everything."""
READ_TIMEOUT_S = 30.0
SERVE_ENV = {
    # Tables play no part in what a consumer reads, and cost time.
    "ICEFLOE_TABLE__FORMATS": "[]",
    # Compaction as soon as anything is in the WAL and rounds every fifth of a second; a
    # cleaning every round, and small files merged every second.
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "0.2",
    "ICEFLOE_COMPACTOR__MAINTENANCE_INTERVAL_S": "1",
    "ICEFLOE_COMPACTOR__REWRITE_MIN_FILES": "2",
}


class Target(Protocol):
    """An Icefloe to drive."""

    bootstrap: str
    runs_compaction: bool
    """Whether the driver runs compaction (in-process) rather than the broker's compactor."""

    def create_topic(self, name: str, configs: dict[str, str]) -> None: ...

    def start_compaction(self, what: str) -> concurrent.futures.Future[object]:
        """Start ``compact``, ``clean`` or ``merge`` (in-process only)."""
        ...

    def cleaned_files(self) -> set[str]:
        """The data files log compaction wrote so far (those it replaced stay a while)."""
        ...

    def log_tail(self) -> str:
        """The end of the server's log, for a failure to show."""
        ...


class InProcessIcefloe:
    """A broker on an event loop of its own in this process, its compactor off: the driver runs
    a :class:`Compactor` on the same storage itself, so compaction, cleaning and merges happen
    exactly when it says, while Kafka clients talk to the broker over TCP."""

    runs_compaction = True

    def __init__(
        self, data_dir: Path, *, replaced_wal_reads_s: float, tables: bool = False
    ) -> None:
        """``tables``: commit compacted files to the installed table formats (they play no
        part in what a consumer reads, and cost time)."""
        self.config: Config = load_config(
            env={},
            overrides={
                "data_dir": str(data_dir),
                "compactor": {"enabled": False, "rewrite_min_files": 2, "yield_above_cpu": 1},
                "table": {"formats": "installed" if tables else []},
                "storage": {"flush_interval_ms": 2, "replaced_wal_reads_s": replaced_wal_reads_s},
            },
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="broker-loop")
        self._thread.start()
        self.broker, self.compactor, port = self.run(self._start())
        self.bootstrap = f"127.0.0.1:{port}"

    async def _start(self) -> tuple[Broker, Compactor, int]:
        broker = await Broker.open(self.config)
        info = await broker.start(port=0)
        compactor = await Compactor.open(self.config, broker.storage, broker.topics)
        return broker, compactor, info.port

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def create_topic(self, name: str, configs: dict[str, str]) -> None:
        self.run(self.broker.topics.create(name, 1, configs))

    def start_compaction(self, what: str) -> concurrent.futures.Future[object]:
        work: Coroutine[Any, Any, object]
        if what == "compact":
            work = self.compactor.compact_once(force=True)
        elif what == "clean":
            work = self.compactor.clean_once(force=True)
        else:
            work = self.compactor.rewrite_once()
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def cleaned_files(self) -> set[str]:
        return _cleaned_files(Path(self.config.data_dir))

    def log_tail(self) -> str:
        return ""  # the test's own log has it

    def close(self) -> None:
        async def stop() -> None:
            await self.compactor.close()
            await self.broker.stop()

        try:
            self.run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)
            self._loop.close()


def _cleaned_files(data_dir: Path) -> set[str]:
    return {path.name for path in data_dir.rglob(f"*-c{'[0-9a-f]' * 16}.parquet")}


@dataclass
class ServedIcefloe:
    """``icefloe serve`` with quick compaction and cleaning: they run on their own time."""

    running: RunningIcefloe
    runs_compaction = False

    @classmethod
    def start(cls, data_dir: Path, env: dict[str, str] | None = None) -> ServedIcefloe:
        """Start it, and wait until its compactor leads (its process takes seconds to start):
        the round's actions then run beside compaction from the first."""
        running = start_icefloe(data_dir, env=SERVE_ENV | (env or {}))
        deadline = time.monotonic() + 120
        while "leads compaction" not in running.log_path.read_text():
            if time.monotonic() > deadline:
                running.stop()
                raise AssertionError("the compactor did not start within 120 s")
            time.sleep(0.2)
        return cls(running)

    @property
    def bootstrap(self) -> str:
        return self.running.bootstrap

    def create_topic(self, name: str, configs: dict[str, str]) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, 1, config=configs)])[name].result(30)

    def start_compaction(self, what: str) -> concurrent.futures.Future[object]:
        raise AssertionError("icefloe serve compacts on its own")

    def cleaned_files(self) -> set[str]:
        return _cleaned_files(self.running.data_dir)

    def log_tail(self) -> str:
        return self.running.log_path.read_text()[-3000:]


@dataclass
class _Producers:
    """The transactional producers (kept across episodes) and the plain one."""

    transactional: list[Producer]
    plain: Producer
    open: list[Transaction | None] = field(default_factory=list)

    @classmethod
    def start(cls, bootstrap: str, run: str) -> _Producers:
        transactional = []
        for i in range(TRANSACTIONAL_PRODUCERS):
            producer = Producer(
                {"bootstrap.servers": bootstrap, "transactional.id": f"{run}-writer-{i}"}
            )
            producer.init_transactions(30)
            transactional.append(producer)
        plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        return cls(transactional, plain, [None] * TRANSACTIONAL_PRODUCERS)


class ReadChaos:
    """Runs episodes of random actions against ``target`` and checks every read."""

    def __init__(self, target: Target, seed: int, run: str = "chaos") -> None:
        self.target = target
        self.seed = seed
        self.rng = random.Random(seed)
        self.model = Model()
        self.run_name = run
        self.producers = _Producers.start(target.bootstrap, run)
        self.episode = 0
        self.actions: list[str] = []
        """This episode's actions so far, for a failure to show."""
        self.reads = 0
        self.interleavings = 0
        self.seconds: dict[str, float] = {}
        """Time spent per kind of action."""
        self.did: dict[str, int] = {}
        """In-process: how many compactions, cleanings and merges did something."""
        self._pending: tuple[str, concurrent.futures.Future[object]] | None = None
        self._topics: list[str] = []
        self._sequence = 0

    # --- episodes ------------------------------------------------------------------------

    def run_episode(self, steps: int) -> None:
        self.episode += 1
        self.actions = []
        retention = self.rng.choice([0, 5_000, DAY_MS])
        compacted = f"{self.run_name}-cd-{self.episode}"
        plain = f"{self.run_name}-plain-{self.episode}"
        configs = {
            "cleanup.policy": "compact,delete",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": str(retention),
        }
        self.target.create_topic(compacted, configs)
        self.target.create_topic(plain, {"cleanup.policy": "delete"})
        self.model.add_partition(f"{compacted}/0", compacted=True, delete_retention_ms=retention)
        self.model.add_partition(f"{plain}/0", compacted=False)
        self._topics = [compacted, plain]
        self._log(f"episode {self.episode}: {compacted} (delete.retention.ms={retention}), {plain}")
        for _ in range(steps):
            self._step()
            self.interleavings += 1
        self._finish_pending()
        for i, transaction in enumerate(self.producers.open):
            if transaction is not None:
                self._end(i, self.rng.random() < 0.7)
        self._settle()
        for topic in self._topics:
            for isolation in (READ_COMMITTED, READ_UNCOMMITTED):
                self._read(topic, isolation, 0)

    def _settle(self) -> None:
        """Before the episode's last reads: everything compacted and cleaned. Against
        ``icefloe serve``, a record for the compacted topic, then a wait until a cleaning wrote
        a data file (every transaction has ended: nothing holds compaction back).

        Raises:
            AssertionError: serve cleaned nothing within 120 s.
        """
        if self.target.runs_compaction:
            for what in ("compact", "clean"):
                self._compaction(what, background=False)
            return
        before = self.target.cleaned_files()
        self._send(self.producers.plain, self._topics[0], self._records(self._topics[0]), None)
        deadline = time.monotonic() + 120
        while not self.target.cleaned_files() - before:
            if time.monotonic() > deadline:
                tail = self.target.log_tail()
                raise AssertionError(f"nothing cleaned within 120 s; the log ends:\n{tail}")
            time.sleep(0.2)
        self._log("  a cleaning wrote a data file")

    def close(self) -> None:
        """End what is under way and close the producers (before the broker stops)."""
        try:
            self._finish_pending()
            for i, transaction in enumerate(self.producers.open):
                if transaction is not None:
                    self._end(i, commit=False)
        finally:
            for producer in [*self.producers.transactional, self.producers.plain]:
                producer.close()

    def _step(self) -> None:
        choices: list[tuple[Callable[[], None], float]] = [
            (self._transactional_write, 4),
            (self._transaction_end, 3),
            (self._plain_write, 2),
            (self._random_read, 4),
        ]
        if self.target.runs_compaction:
            choices += [
                (functools.partial(self._random_compaction, "compact"), 2),
                (functools.partial(self._random_compaction, "clean"), 2),
                (functools.partial(self._random_compaction, "merge"), 0.5),
            ]
        actions, weights = zip(*choices, strict=True)
        action = self.rng.choices(actions, weights)[0]
        started = time.monotonic()
        action()
        name = action.args[0] if isinstance(action, functools.partial) else action.__name__[1:]
        self.seconds[name] = self.seconds.get(name, 0.0) + time.monotonic() - started

    # --- writes --------------------------------------------------------------------------

    def _records(self, topic: str) -> list[tuple[bytes | None, bytes | None, int]]:
        """(key, value, timestamp) of one to three records; a timestamp of 0 is now."""
        records = []
        for _ in range(self.rng.randint(1, 3)):
            self._sequence += 1
            key = self.rng.choice(KEYS)
            value = None if self.rng.random() < 0.15 else b"v%d" % self._sequence
            old = self.rng.random() < 0.2
            timestamp = int(time.time() * 1000) - 3 * DAY_MS if old else 0
            records.append((key, value, timestamp))
        return records

    def _send(
        self,
        producer: Producer,
        topic: str,
        records: list[tuple[bytes | None, bytes | None, int]],
        transaction: Transaction | None,
    ) -> None:
        partition = f"{topic}/0"
        results: list[tuple[int, Any, Any]] = []
        for n, (key, value, timestamp) in enumerate(records):
            self.model.will_write(partition, transaction)

            def delivered(error: Any, message: Any, n: int = n) -> None:
                results.append((n, error, message))

            producer.produce(
                topic,
                key=key,
                value=value,
                partition=0,
                timestamp=timestamp,
                on_delivery=delivered,
            )
        assert producer.flush(30) == 0, "records not delivered within 30 s"
        wrote = []
        for n, error, message in sorted(results, key=lambda r: r[0]):
            assert error is None, f"{topic}: {error}"
            key, value, _ = records[n]
            offset = message.offset()
            self.model.written(partition, offset, key, value, message.timestamp()[1], transaction)
            wrote.append(f"{offset}:{key!r}={value!r}")
        writer = transaction.name if transaction else "plain"
        self._log(f"  {writer} wrote {topic} {', '.join(wrote)}")

    def _transactional_write(self) -> None:
        i = self.rng.randrange(TRANSACTIONAL_PRODUCERS)
        producer = self.producers.transactional[i]
        transaction = self.producers.open[i]
        if transaction is None:
            producer.begin_transaction()
            self._sequence += 1
            transaction = Transaction(f"txn{self._sequence}@w{i}")
            self.producers.open[i] = transaction
        for topic in self.rng.sample(self._topics, self.rng.randint(1, 2)):
            self._send(producer, topic, self._records(topic), transaction)

    def _transaction_end(self) -> None:
        open_ones = [i for i, t in enumerate(self.producers.open) if t is not None]
        if open_ones:
            self._end(self.rng.choice(open_ones), self.rng.random() < 0.6)

    def _end(self, i: int, commit: bool) -> None:
        producer = self.producers.transactional[i]
        transaction = self.producers.open[i]
        assert transaction is not None
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        self.model.decided(transaction, Outcome.COMMITTED if commit else Outcome.ABORTED)
        self.producers.open[i] = None
        self._log(f"  {transaction.name} {'committed' if commit else 'aborted'}")

    def _plain_write(self) -> None:
        topic = self.rng.choice(self._topics)
        self._send(self.producers.plain, topic, self._records(topic), None)

    # --- compaction (in-process) ---------------------------------------------------------

    def _random_compaction(self, what: str) -> None:
        self._compaction(what, background=self.rng.random() < 0.5)

    def _compaction(self, what: str, *, background: bool) -> None:
        self._finish_pending()
        future = self.target.start_compaction(what)
        self._log(f"  {what}{' (in the background)' if background else ''}")
        self._pending = (what, future)
        if not background:
            self._finish_pending()

    def _finish_pending(self) -> None:
        if self._pending is None:
            return
        what, future = self._pending
        self._pending = None
        result = future.result(120)
        self._log(f"  {what} done: {result}")
        if result is not None:
            self.did[what] = self.did.get(what, 0) + 1
        if what == "clean":
            self._cleaning_may_have_run()

    def _cleaning_may_have_run(self) -> None:
        now_ms = int(time.time() * 1000)
        for name, partition in self.model.partitions.items():
            if partition.compacted:
                self.model.cleaned(name, now_ms)

    # --- reads ---------------------------------------------------------------------------

    def _random_read(self) -> None:
        topic = self.rng.choice(self._topics)
        isolation = self.rng.choice([READ_COMMITTED, READ_UNCOMMITTED])
        partition = self.model.partitions[f"{topic}/0"]
        end = partition.stable_offset() if isolation == READ_COMMITTED else partition.log_end
        start = 0 if self.rng.random() < 0.4 else self.rng.randint(0, end)
        self._read(topic, isolation, start)

    def _read(self, topic: str, isolation: str, start: int) -> None:
        partition = self.model.partitions[f"{topic}/0"]
        end = partition.stable_offset() if isolation == READ_COMMITTED else partition.log_end
        client = self.rng.choice(["confluent-kafka", "confluent-kafka", "kafka-python"])
        fetch_limit = self.rng.choice(FETCH_LIMITS)
        read = read_confluent if client == "confluent-kafka" else read_kafka_python
        seen, reached, listed = read(
            self.target.bootstrap, topic, isolation, start, end, fetch_limit
        )
        self._finish_pending()  # what ran beside the read counts for it
        if not self.target.runs_compaction:
            self._cleaning_may_have_run()
        self.reads += 1
        what = f"{client} {isolation} {topic} from {start} (fetch limit {fetch_limit})"
        self._log(f"  read {what}: {len(seen)} records, to {reached}")
        problems = self.model.check(f"{topic}/0", isolation, start, reached, seen)
        if listed != end:
            problems.append(f"ListOffsets answered {listed}, not {end}")
        if problems:
            raise AssertionError(
                f"seed {self.seed}, episode {self.episode}: {what}:\n"
                + problems_text(problems)
                + f"\nread: {seen}\nactions:\n"
                + "\n".join(self.actions)
            )

    def _log(self, line: str) -> None:
        self.actions.append(line)


Reader = Callable[[str, str, str, int, int, int], tuple[list[Seen], int, int]]
"""Reads a partition: (bootstrap, topic, isolation, start, end, fetch limit) → (records, where
the read ended, ListOffsets' end)."""


def read_confluent(
    bootstrap: str, topic: str, isolation: str, start: int, end: int, fetch_limit: int
) -> tuple[list[Seen], int, int]:
    """The records a confluent-kafka consumer reads from ``start`` until it reports the end
    of the partition at ``end`` or later (or ``READ_TIMEOUT_S`` passes), where it reported
    the end last, and the end ListOffsets answers for ``isolation``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "read-chaos",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
            "max.partition.fetch.bytes": fetch_limit,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        seen: list[Seen] = []
        reached = -1
        deadline = time.monotonic() + READ_TIMEOUT_S
        while reached < end and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is None:
                seen.append((message.offset(), message.key(), message.value()))
            elif error.code() == KafkaError._PARTITION_EOF:
                reached = message.offset()
            else:
                raise AssertionError(f"{topic}: {error}")
        listed = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
        return seen, reached, listed
    finally:
        consumer.close()


def read_kafka_python(
    bootstrap: str, topic: str, isolation: str, start: int, end: int, fetch_limit: int
) -> tuple[list[Seen], int, int]:
    """:func:`read_confluent` with kafka-python, whose read_committed logic is the Java
    client's: until its position reaches ``end``."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="none",
        max_partition_fetch_bytes=fetch_limit,
        fetch_max_wait_ms=50,
    )
    try:
        tp = KafkaPythonPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        seen: list[Seen] = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                seen.extend((r.offset, r.key, r.value) for r in records)
        listed = consumer.end_offsets([tp])[tp]
        return seen, consumer.position(tp), listed
    finally:
        consumer.close()


def run_episodes(
    target: Target, seed: int, episodes: int, steps: int, run: str = "chaos"
) -> ReadChaos:
    """``episodes`` episodes of ``steps`` actions each; the driver, for its counts."""
    chaos = ReadChaos(target, seed, run)
    try:
        for _ in range(episodes):
            chaos.run_episode(steps)
    finally:
        chaos.close()
    return chaos
