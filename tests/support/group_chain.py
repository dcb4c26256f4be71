"""A pipeline of consumer groups: each group consumes one topic and produces to the next.

``topics[0]`` is fed by a :class:`Source`; group *i* consumes ``topics[i]`` and produces each
record, key and value unchanged, to ``topics[i + 1]``; a :class:`Sink` reads the last topic
without a group. Every member is a confluent-kafka consumer with an idempotent producer, in a
thread of its own, processing at least once: a batch is produced and acknowledged before its
offsets are committed (synchronously, or stored for the client's auto-commit). So every
record the source wrote must reach the last topic at least once; more than once only when a
partition moved before its processed records were committed.

When records stop flowing, :func:`stall_report` says what was stuck: each group's record as
the brokers store it (state, generation or epochs, every member's assignment and target),
committed offsets against the log end per partition, who owns a lagging partition by the
store and by the clients, what that client last fetched, and its librdkafka debug log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from icefloe.config import load_config
from icefloe.groups.model import ClassicGroup, ConsumerGroup
from icefloe.groups.store import GroupStore
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from tests.support.group_members import HEARTBEAT_MS, REBALANCE_TIMEOUT_MS, SESSION_TIMEOUT_MS

FLAVOURS: Final[dict[str, dict[str, Any]]] = {
    "classic-range": {"group.protocol": "classic", "partition.assignment.strategy": "range"},
    "classic-roundrobin": {
        "group.protocol": "classic",
        "partition.assignment.strategy": "roundrobin",
    },
    "classic-cooperative-sticky": {
        "group.protocol": "classic",
        "partition.assignment.strategy": "cooperative-sticky",
    },
    "consumer-uniform": {"group.protocol": "consumer", "group.remote.assignor": "uniform"},
    "consumer-range": {"group.protocol": "consumer", "group.remote.assignor": "range"},
}
"""Consumer settings of each kind of group member, by name."""

DEBUG_CONTEXTS: Final = "cgrp,consumer,fetch,topic"
LOG_LINES_KEPT: Final = 3000
"""librdkafka debug lines each member keeps (the newest), for a stall report."""
BATCH: Final = 200
"""Records a member processes between commits."""


def value_of(number: int) -> bytes:
    return b"%08d" % number


class _RingLog(logging.Handler):
    """A logging handler keeping the newest lines in memory."""

    def __init__(self, lines: int) -> None:
        super().__init__()
        self.lines: collections.deque[str] = collections.deque(maxlen=lines)

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        # Every consume() asks for the assignment and member id: not worth a line each.
        if "received op GET_ASSIGNMENT" not in message and "received op NAME" not in message:
            self.lines.append(f"{record.created:.3f} {message}")


@dataclass
class Fetched:
    """What a member's client last handed out of one partition."""

    offset: int
    at: float
    """time.monotonic()"""


class ChainMember:
    """One member of group ``group``: consumes ``source``, produces to ``target``."""

    def __init__(
        self,
        name: str,
        bootstrap: str,
        group: str,
        source: str,
        target: str,
        flavour: str,
        *,
        auto_commit: bool = False,
        debug: bool = True,
    ) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.group = group
        self.source = source
        self.target = target
        self.flavour = flavour
        self.auto_commit = auto_commit
        self.member_id = ""
        self.assignment: frozenset[int] = frozenset()
        self.fetched: dict[int, Fetched] = {}
        self.committed: dict[int, int] = {}
        self._unconfirmed: collections.Counter[bytes] = collections.Counter()
        self._stored: dict[int, list[tuple[int, bytes]]] = {}
        """Auto-commit: (offset, value) stored per partition, not yet seen committed."""
        self.processed = 0
        self.produced = 0
        self.events: collections.deque[str] = collections.deque(maxlen=200)
        """Client errors, failed commits and deliveries (bounded)."""
        self.failure: str | None = None
        """Why the member's thread ended early, if it did."""
        self.log = _RingLog(LOG_LINES_KEPT if debug else 0)
        self._debug = debug
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.started = 0.0

    def start(self) -> ChainMember:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop_soon(self) -> None:
        """Start leaving the group (see :meth:`stop`)."""
        self._stop.set()

    def stop(self, timeout: float = 60) -> None:
        """Leave the group (the client's close) and wait for the thread."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.name} did not stop within {timeout} s"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _note(self, what: str) -> None:
        self.events.append(f"{time.monotonic() - self.started:7.2f}s {what}")

    def _run(self) -> None:
        try:
            self._process()
        except Exception as exc:  # reported by the test through ``failure``
            self.failure = repr(exc)
            raise

    def _consumer_config(self) -> dict[str, Any]:
        logger = logging.getLogger(f"chain.{self.name}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self.log)
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": self.name,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": self.auto_commit,
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": 500,
            "logger": logger,
            "on_commit": self._on_commit,
            **FLAVOURS[self.flavour],
        }
        if self._debug:
            conf["debug"] = DEBUG_CONTEXTS
        if conf["group.protocol"] == "classic":
            conf.update(
                {
                    "session.timeout.ms": SESSION_TIMEOUT_MS,
                    "heartbeat.interval.ms": HEARTBEAT_MS,
                    "max.poll.interval.ms": REBALANCE_TIMEOUT_MS,
                }
            )
        return conf

    def _process(self) -> None:
        from confluent_kafka import Consumer, Producer

        consumer = Consumer(self._consumer_config())
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "client.id": f"{self.name}-out",
                "enable.idempotence": True,
                "linger.ms": 5,
            }
        )
        # With callbacks, the client applies every assignment change inside consume(), on this
        # thread, never while a batch is in hand: a partition is not revoked between the
        # processing of its records and their commit.
        consumer.subscribe(
            [self.source],
            on_assign=self._rebalanced("assigned"),
            on_revoke=self._rebalanced("revoked"),
            on_lost=self._rebalanced("lost"),
        )
        try:
            while not self._stop.is_set():
                messages = consumer.consume(BATCH, 0.1)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                self.member_id = consumer.memberid() or self.member_id
                batch = []
                for message in messages:
                    error = message.error()
                    if error is not None:
                        self._note(f"consume error: {error}")
                        continue
                    self.fetched[message.partition()] = Fetched(message.offset(), time.monotonic())
                    batch.append(message)
                if batch:
                    self._forward(consumer, producer, batch)
        finally:
            with contextlib.suppress(Exception):
                producer.flush(10)
            consumer.close()

    def _rebalanced(self, what: str) -> Callable[[Any, list[Any]], None]:
        def note(_: Any, partitions: list[Any]) -> None:
            self._note(f"{what} {sorted(tp.partition for tp in partitions)}")
            if what != "assigned":
                # Offsets stored for a partition given up may never be committed (a lost one's
                # are dropped), and a later commit of the partition, once it is back, does
                # not cover them.
                for tp in partitions:
                    pending = self._stored.pop(tp.partition, [])
                    self._unconfirmed.update(value for _, value in pending)

        return note

    @property
    def unconfirmed(self) -> collections.Counter[bytes]:
        """Values this member produced whose offsets it never saw committed: only these may
        arrive downstream more than once (the partition's next owner processes them again)."""
        stored = list(self._stored.values())  # one copy, made while the GIL is held
        return self._unconfirmed + collections.Counter(v for pending in stored for _, v in pending)

    def _on_commit(self, error: Any, partitions: list[Any]) -> None:
        """Auto-commit results: stored offsets now committed, or not."""
        if error is not None:
            self._note(f"auto-commit failed: {error}")
            return
        for tp in partitions:
            if tp.error is None and tp.topic == self.source and tp.offset >= 0:
                pending = self._stored.get(tp.partition, [])
                self._stored[tp.partition] = [(o, v) for o, v in pending if o >= tp.offset]

    def _forward(self, consumer: Any, producer: Any, batch: list[Any]) -> None:
        """Produce the batch, wait for every acknowledgement, then commit what was delivered."""
        from confluent_kafka import KafkaException, TopicPartition

        failed: dict[int, int] = {}
        """Per source partition, the first offset whose record was not delivered."""

        def delivered(error: Any, message: Any, source: tuple[int, int]) -> None:
            if error is not None:
                partition, offset = source
                failed[partition] = min(offset, failed.get(partition, offset))
                self._note(f"delivery of {partition}:{offset} failed: {error}")

        for message in batch:
            source = (message.partition(), message.offset())
            while True:
                try:
                    producer.produce(
                        self.target,
                        key=message.key(),
                        value=message.value(),
                        on_delivery=lambda e, m, s=source: delivered(e, m, s),
                    )
                    break
                except BufferError:
                    producer.poll(0.1)
        while producer.flush(1) > 0:
            if self._stop.is_set() and producer.flush(10) > 0:
                # Not all delivered, so not committed: processed again by the next owner.
                self._unconfirmed.update(m.value() for m in batch)
                return
        self.produced += len(batch)
        ends: dict[int, int] = {}
        for message in batch:
            ends[message.partition()] = message.offset() + 1
        for partition, offset in failed.items():
            # Process those records again; commit only what came before them.
            with contextlib.suppress(KafkaException):
                consumer.seek(TopicPartition(self.source, partition, offset))
            ends[partition] = offset
        # Records at or after a partition's commit point are processed again (a record whose
        # delivery failed may have been written all the same).
        self._unconfirmed.update(m.value() for m in batch if m.offset() >= ends[m.partition()])
        forwarded = [m for m in batch if m.offset() < ends[m.partition()]]
        offsets = [
            TopicPartition(self.source, p, o)
            for p, o in ends.items()
            if o > self.committed.get(p, -1)
        ]
        if not offsets:
            return
        try:
            if self.auto_commit:
                consumer.store_offsets(offsets=offsets)
            else:
                consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # Lost the partition in a rebalance: its next owner processes these again.
            self._unconfirmed.update(m.value() for m in forwarded)
            self._note(f"commit of {[(tp.partition, tp.offset) for tp in offsets]} failed: {exc}")
            return
        if self.auto_commit:
            for m in forwarded:
                self._stored.setdefault(m.partition(), []).append((m.offset(), m.value()))
        for tp in offsets:
            self.committed[tp.partition] = tp.offset
        self.processed += len(batch)


class Source:
    """Produces ``count`` numbered records to a topic, spread over ``seconds``, idempotently."""

    def __init__(self, bootstrap: str, topic: str, count: int, seconds: float) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.count = count
        self.seconds = seconds
        self.acknowledged = 0
        self.failure: str | None = None
        self._thread = threading.Thread(target=self._run, name="chain source", daemon=True)

    def start(self) -> Source:
        self._thread.start()
        return self

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the source did not finish"
        assert self.failure is None, f"the source failed: {self.failure}"

    def _run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer(
                {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5}
            )
            errors: list[str] = []

            def delivered(error: Any, _: Any) -> None:
                if error is None:
                    self.acknowledged += 1
                else:
                    errors.append(str(error))

            started = time.monotonic()
            for number in range(self.count):
                # Evenly over the run, so records flow while members come and go.
                due = started + self.seconds * number / self.count
                if (ahead := due - time.monotonic()) > 0:
                    producer.poll(ahead)
                value = value_of(number)
                producer.produce(self.topic, key=value, value=value, on_delivery=delivered)
            while producer.flush(1) > 0:
                pass
            assert not errors, f"source records not delivered: {errors[:5]}"
        except Exception as exc:
            self.failure = repr(exc)
            raise


class Sink:
    """Reads every partition of a topic from the start, without a group, counting values."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.values: collections.Counter[bytes] = collections.Counter()
        self.ends: dict[int, int] = {}
        """Per partition, the offset after the last record read."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chain sink", daemon=True)

    def start(self) -> Sink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"{self.topic}-sink",
                "enable.auto.commit": False,
            }
        )
        consumer.assign(
            [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(self.partitions)]
        )
        try:
            while not self._stop.is_set():
                for message in consumer.consume(500, 0.2):
                    if message.error() is None:
                        self.values[message.value()] += 1
                        self.ends[message.partition()] = message.offset() + 1
        finally:
            consumer.close()


@dataclass
class Outcome:
    """What reached the last topic."""

    missing: list[int]
    duplicates: int
    """Records that arrived more than once (each extra copy counts)."""
    seconds: float


def unexplained_copies(chain: Chain, sink: Sink) -> dict[bytes, tuple[int, int]]:
    """Values that reached the sink more often than uncommitted processing explains, with
    (copies, uncommitted forwards): each group may add a copy of a record only by producing
    it again after a member processed it without its commit going through."""
    unconfirmed: collections.Counter[bytes] = collections.Counter()
    for member in chain.everyone():
        unconfirmed.update(member.unconfirmed)
    return {
        value: (copies, unconfirmed[value])
        for value, copies in sink.values.items()
        if copies - 1 > unconfirmed[value]
    }


@dataclass
class Chain:
    """The whole pipeline: topics, groups and their members, source and sink."""

    bootstrap: Sequence[str]
    """One address per broker; members take them in turn as their bootstrap."""
    data_dir: Any
    topics: list[str]
    groups: list[str]
    flavours: list[str]
    partitions: int
    auto_commit: Sequence[bool] = ()
    """Per group, whether its members auto-commit (default: all commit synchronously)."""
    debug: bool = True
    members: dict[str, list[ChainMember]] = field(default_factory=dict)
    retired: list[ChainMember] = field(default_factory=list)
    _joined: int = 0

    def add_member(self, index: int) -> ChainMember:
        group = self.groups[index]
        bootstrap = self.bootstrap[self._joined % len(self.bootstrap)]
        auto = bool(self.auto_commit and self.auto_commit[index])
        member = ChainMember(
            f"{group}-m{self._joined}",
            bootstrap,
            group,
            self.topics[index],
            self.topics[index + 1],
            self.flavours[index],
            auto_commit=auto,
            debug=self.debug,
        )
        self._joined += 1
        self.members.setdefault(group, []).append(member)
        return member.start()

    def remove_oldest(self, index: int) -> ChainMember:
        member = self.members[self.groups[index]].pop(0)
        member.stop()
        self.retired.append(member)
        return member

    def everyone(self) -> list[ChainMember]:
        return [*self.retired, *(m for ms in self.members.values() for m in ms)]

    def stop(self) -> None:
        """Stop every member, all at once (each close takes a while)."""
        running = [m for ms in self.members.values() for m in ms]
        for member in running:
            member.stop_soon()
        for member in running:
            with contextlib.suppress(AssertionError):
                member.stop()

    def failures(self) -> list[str]:
        return [f"{m.name}: {m.failure}" for m in self.everyone() if m.failure]


def churn(chain: Chain, step: int, most: int = 3) -> str:
    """One membership change, in turn over the groups: a group at ``most`` members loses its
    oldest (a clean leave), any other gains one."""
    index = step % len(chain.groups)
    members = chain.members.get(chain.groups[index], [])
    if len(members) >= most:
        return f"{chain.remove_oldest(index).name} left"
    return f"{chain.add_member(index).name} joined"


def await_records(
    sink: Sink,
    count: int,
    deadline_s: float,
    during: Callable[[float], bool] | None = None,
) -> Outcome:
    """Wait until every one of ``count`` values has reached the sink, or the deadline.

    ``during(elapsed)`` runs about every 0.2 s meanwhile (membership changes, faults) and
    says whether it has more to do: the wait lasts at least until it has not.
    """
    started = time.monotonic()
    wanted = {value_of(n) for n in range(count)}
    busy = during is not None
    while time.monotonic() - started < deadline_s:
        if during is not None:
            busy = during(time.monotonic() - started)
        if not busy and wanted <= sink.values.keys():
            break
        time.sleep(0.2)
    missing = sorted(n for n in range(count) if value_of(n) not in sink.values)
    duplicates = sum(c - 1 for v, c in sink.values.items() if c > 1)
    return Outcome(missing, duplicates, time.monotonic() - started)


def hop_report(chain: Chain, values: Iterable[bytes], shown: int = 5) -> str:
    """Where each of ``values`` sits in every topic of the chain (partition:offset of each
    copy), read from the store: the group between the topic with one copy and the topic with
    two is the one that processed the record twice."""
    wanted = set(values)
    found = asyncio.run(_positions(chain, wanted))
    lines = []
    for value in sorted(wanted)[:shown]:
        where = "; ".join(
            f"{topic}: {', '.join(found[topic].get(value, [])) or 'absent'}"
            for topic in chain.topics
        )
        lines.append(f"{value.decode()}: {where}")
    added = [
        sum(len(found[b].get(v, [])) - len(found[a].get(v, [])) for v in wanted)
        for a, b in zip(chain.topics, chain.topics[1:], strict=False)
    ]
    lines.append(
        f"copies of these added by each group: {dict(zip(chain.groups, added, strict=True))}"
    )
    return "\n".join(lines)


async def _positions(chain: Chain, wanted: set[bytes]) -> dict[str, dict[bytes, list[str]]]:
    config = load_config(env={}, overrides={"data_dir": str(chain.data_dir)})
    out: dict[str, dict[bytes, list[str]]] = {}
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        for topic in chain.topics:
            known = await topics.get(topic)
            assert known is not None
            where: dict[bytes, list[str]] = {}
            for p, stream in enumerate(known.streams):
                offset, end = await storage.log_start(stream), await storage.log_end(stream)
                while offset < end:
                    records = await storage.read_records(stream, offset)
                    for r in records:
                        if r.value in wanted:
                            where.setdefault(r.value, []).append(f"{p}:{r.offset}")
                    offset = records[-1].offset + 1
            out[topic] = where
    return out


# --- what was stuck --------------------------------------------------------------------------


def stall_report(chain: Chain, outcome: Outcome, log_lines: int = 60) -> str:
    """Everything that says where records stopped, for the failure message."""
    lines = [
        f"{len(outcome.missing)} of the records never reached {chain.topics[-1]} "
        f"(first missing: {outcome.missing[:10]}) after {outcome.seconds:.0f} s"
    ]
    stored = asyncio.run(_stored_state(chain))
    lagging: list[tuple[str, str, int]] = []
    for index, group in enumerate(chain.groups):
        topic = chain.topics[index]
        record, offsets, ends = stored[group]
        lines.append(f"== group {group} ({chain.flavours[index]}) consuming {topic}")
        lines.extend(f"   {line}" for line in _describe_record(record))
        clients = chain.members.get(group, [])
        for p in range(chain.partitions):
            committed, end = offsets.get(p), ends[p]
            owners = [m.name for m in clients if p in m.assignment]
            flag = "" if committed == end else "   <-- lagging"
            lines.append(
                f"   {topic}[{p}] committed {committed} log end {end} "
                f"owned by clients {owners or 'nobody'}{flag}"
            )
            if committed != end:
                lagging.append((group, topic, p))
        for m in clients:
            fetched = {
                p: f"{f.offset} ({time.monotonic() - f.at:.1f} s ago)" for p, f in m.fetched.items()
            }
            lines.append(
                f"   client {m.name} id {m.member_id!r} alive={m.alive} owns "
                f"{sorted(m.assignment)} committed {m.committed} last fetched {fetched} "
                f"processed {m.processed}"
            )
            lines.extend(f"      {e}" for e in list(m.events)[-10:])
    for group, topic, p in lagging[:3]:
        for m in chain.members.get(group, []):
            if p in m.assignment or not any(p in o.assignment for o in chain.members[group]):
                lines_now = list(m.log.lines)  # one copy, made while the GIL is held
                tail = [line for line in lines_now if topic in line or "HEARTBEAT" in line]
                lines.append(f"== last debug lines of {m.name} (for {topic}[{p}])")
                lines.extend(f"   {line}" for line in tail[-log_lines:])
    return "\n".join(lines)


async def _stored_state(
    chain: Chain,
) -> dict[str, tuple[ClassicGroup | ConsumerGroup | None, dict[int, int], dict[int, int]]]:
    config = load_config(env={}, overrides={"data_dir": str(chain.data_dir)})
    out = {}
    async with await StreamStorage.open(config) as storage:
        store = GroupStore(storage.metadata)
        topics = TopicRegistry(storage)
        for index, group in enumerate(chain.groups):
            stored = await store.load(group)
            topic = chain.topics[index]
            committed = await store.fetch_offsets(group, {topic: range(chain.partitions)})
            known = await topics.get(topic)
            assert known is not None
            ends = {p: await storage.log_end(s) for p, s in enumerate(known.streams)}
            out[group] = (
                stored.group if stored else None,
                {p: o.offset for (_, p), o in committed.items()},
                ends,
            )
    return out


def _describe_record(group: ClassicGroup | ConsumerGroup | None) -> Iterable[str]:
    from icefloe.groups.consumer_protocol import assigned_partitions

    if group is None:
        yield "no group record"
        return
    if isinstance(group, ClassicGroup):
        yield (
            f"classic {group.state.value} generation {group.generation} protocol "
            f"{group.protocol_name} leader {group.leader}"
        )
        for m in group.members:
            yield (
                f"member {m.member_id} joined={m.joined} assignment "
                f"{assigned_partitions(m.assignment) if m.assignment else {}}"
            )
        return
    yield (
        f"consumer {group.state_name} group epoch {group.group_epoch} assignment epoch "
        f"{group.assignment_epoch} assignor {group.assignor}"
    )
    for m in group.members:
        yield (
            f"member {m.member_id} epoch {m.member_epoch} (prev {m.previous_member_epoch}) "
            f"{m.state.value} assigned {_parts(m.assigned)} revoking "
            f"{_parts(m.pending_revocation)} target {_parts(group.target.get(m.member_id, {}))}"
        )


def _parts(assignment: Any) -> list[int]:
    return sorted(p for parts in assignment.values() for p in parts)
