"""Consumer group members driven by real Kafka clients, for end-to-end group tests.

Each :class:`Member` runs one client in its own thread (aiokafka in its own event loop there),
subscribes to a topic and, for every record, commits the offset after it synchronously. A
record counts as *consumed* only once that commit succeeded; when a commit fails (the member
lost the partition in a rebalance) the member seeks back, so the record is read again by
whoever owns the partition. "Every record consumed exactly once across the group" is then an
exact statement about committed processing.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final

KINDS: Final = ("confluent-classic", "confluent-consumer", "kafka-python", "aiokafka")

SESSION_TIMEOUT_MS: Final = 6000
HEARTBEAT_MS: Final = 500
REBALANCE_TIMEOUT_MS: Final = 15000

BROKER_ENV: Final = {
    "ICEFLOE_GROUPS__MIN_SESSION_TIMEOUT_MS": "1000",
    "ICEFLOE_GROUPS__INITIAL_REBALANCE_DELAY_MS": "500",
    "ICEFLOE_GROUPS__CONSUMER_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS),
    "ICEFLOE_GROUPS__CONSUMER_HEARTBEAT_INTERVAL_MS": str(HEARTBEAT_MS),
}
"""Server settings for short group timeouts in tests."""


class Member:
    """One group member: ``start()``, watch ``assignment`` and ``consumed``, ``stop()``."""

    def __init__(
        self, kind: str, bootstrap: str, group: str, topic: str, client_id: str = "icefloe-test"
    ) -> None:
        self.kind = kind
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.client_id = client_id
        self.assignment: frozenset[int] = frozenset()
        self.consumed: list[tuple[int, int, bytes]] = []
        """(partition, offset, value) of every record whose commit succeeded."""
        self.errors: list[str] = []
        self.redelivered = 0
        """Records the client handed out again and this member skipped (librdkafka only)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{kind} member", daemon=True)

    def start(self) -> Member:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30) -> None:
        """Leave the group (the client's close) and wait for the thread."""
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.kind} member did not stop"

    def _run(self) -> None:
        try:
            if self.kind.startswith("confluent"):
                self._run_confluent(self.kind.removeprefix("confluent-"))
            elif self.kind == "kafka-python":
                self._run_kafka_python()
            else:
                asyncio.run(self._run_aiokafka())
        except Exception as exc:
            self.errors.append(repr(exc))
            raise

    def _run_confluent(self, protocol: str) -> None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": self.client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "group.protocol": protocol,
        }
        if protocol == "classic":
            conf.update(
                {
                    "session.timeout.ms": SESSION_TIMEOUT_MS,
                    "heartbeat.interval.ms": HEARTBEAT_MS,
                    "max.poll.interval.ms": REBALANCE_TIMEOUT_MS,
                }
            )
        consumer = Consumer(conf)
        consumer.subscribe([self.topic])
        committed_to: dict[int, int] = {}
        """Per partition, the offset after the last record this member committed."""
        try:
            while not self._stop.is_set():
                message = consumer.poll(0.1)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                if message is None or message.error():
                    continue
                partition, offset = message.partition(), message.offset()
                if partition not in self.assignment or offset < committed_to.get(partition, 0):
                    # librdkafka's consumer protocol now and then hands out a record of a
                    # partition it has just given up, or one it has already handed out and
                    # had committed (its position rewound after a reconciliation); the broker
                    # sees no second commit of it. An application skips those as this does.
                    self.redelivered += 1
                    continue
                try:
                    consumer.commit(
                        offsets=[TopicPartition(self.topic, partition, offset + 1)],
                        asynchronous=False,
                    )
                except KafkaException:
                    with contextlib.suppress(KafkaException):
                        consumer.seek(TopicPartition(self.topic, partition, offset))
                    continue
                committed_to[partition] = offset + 1
                self.consumed.append((partition, offset, message.value()))
        finally:
            consumer.close()

    def _run_kafka_python(self) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaError
        from kafka.structs import OffsetAndMetadata

        consumer = KafkaConsumer(
            self.topic,
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.client_id,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            max_poll_interval_ms=REBALANCE_TIMEOUT_MS,
        )
        try:
            while not self._stop.is_set():
                batches = consumer.poll(100)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                for tp, messages in batches.items():
                    for message in messages:
                        try:
                            consumer.commit({tp: OffsetAndMetadata(message.offset + 1, None, -1)})
                        except KafkaError:
                            with contextlib.suppress(Exception):
                                consumer.seek(tp, message.offset)
                            break
                        self.consumed.append((tp.partition, message.offset, message.value))
        finally:
            consumer.close()

    async def _run_aiokafka(self) -> None:
        from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
        from aiokafka.errors import KafkaError
        from aiokafka.structs import OffsetAndMetadata

        # aiokafka rebalances in a background task, and a commit sent after that task rejoined
        # carries the new generation even for a partition that just moved to another member
        # (brokers accept it: commits are checked by generation, not ownership). aiokafka's
        # remedy is a listener that holds the rebalance until the batch in hand is committed.
        processing = asyncio.Lock()

        class FinishBatchFirst(ConsumerRebalanceListener):  # type: ignore[misc]
            async def on_partitions_revoked(self, revoked: object) -> None:
                async with processing:
                    pass

            async def on_partitions_assigned(self, assigned: object) -> None:
                pass

        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            client_id=self.client_id,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            max_poll_interval_ms=REBALANCE_TIMEOUT_MS,
        )
        consumer.subscribe([self.topic], listener=FinishBatchFirst())
        await consumer.start()
        try:
            while not self._stop.is_set():
                batches = await consumer.getmany(timeout_ms=100)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
                await self._process_aiokafka(
                    consumer, batches, processing, OffsetAndMetadata, KafkaError
                )
        finally:
            await consumer.stop()

    async def _process_aiokafka(
        self, consumer: Any, batches: Any, processing: asyncio.Lock, offset_type: Any, error: Any
    ) -> None:
        async with processing:
            for tp, messages in batches.items():
                for message in messages:
                    try:
                        await consumer.commit({tp: offset_type(message.offset + 1, "")})
                    except error:
                        with contextlib.suppress(Exception):
                            consumer.seek(tp, message.offset)
                        break
                    assert message.value is not None
                    self.consumed.append((tp.partition, message.offset, message.value))


def produce(bootstrap: str, topic: str, values: Iterable[int], partitions: int) -> None:
    """Produce ``str(i)`` for each i to partition ``i % partitions``; wait for every ack.

    Idempotently: a request the client retries (after a timeout or a retriable error, which a
    broker may answer for a write that landed) must not write a record twice, or the groups
    would rightly consume it twice.
    """
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
    for i in values:
        producer.produce(topic, value=str(i).encode(), partition=i % partitions)
    assert producer.flush(30) == 0, "records were not acknowledged"


def repeats(members: Sequence[Member]) -> str:
    """Which member consumed which copy of each value consumed more than once: a record read
    twice (one partition and offset) or a record written twice (two offsets)."""
    seen: dict[bytes, list[str]] = {}
    for number, member in enumerate(members):
        for partition, offset, value in member.consumed:
            seen.setdefault(value, []).append(f"member {number} at {partition}:{offset}")
    return "; ".join(
        f"{value!r} by {', '.join(where)}" for value, where in seen.items() if len(where) > 1
    )


def partitioned(members: Iterable[Member], partitions: int) -> bool:
    """Every partition owned by exactly one member, and every member owning some."""
    assignments = [m.assignment for m in members]
    owned = [p for a in assignments for p in a]
    return sorted(owned) == list(range(partitions)) and all(assignments)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)
