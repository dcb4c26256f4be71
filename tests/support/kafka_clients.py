"""Three real Kafka clients behind one small interface: produce a list, read partitions back.

confluent-kafka (librdkafka), kafka-python and aiokafka each encode batches, compress and
decode in their own way; tests that produce with one and read with another check that the
broker stores and serves the bytes exactly, whoever wrote them. Reading uses manual partition
assignment (no consumer group).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import aiokafka
import confluent_kafka
import kafka
from kafka import codec as kafka_python_codec

CLIENTS: Final = ("confluent", "kafka-python", "aiokafka")
CODECS: Final = ("none", "gzip", "snappy", "lz4", "zstd")
READ_TIMEOUT_S: Final = 120.0


@dataclass(frozen=True, slots=True)
class Message:
    """A record as a client reports it; ``offset`` is -1 for a record not yet written."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int


def supports(client: str, codec: str) -> bool:
    """Whether ``client`` can write and read ``codec`` with the libraries installed.

    kafka-python imports optional packages for snappy, lz4 and zstd (python-snappy, lz4,
    zstandard); the others ship their codecs.
    """
    if client != "kafka-python" or codec in ("none", "gzip"):
        return True
    return {
        "snappy": kafka_python_codec.has_snappy,
        "lz4": kafka_python_codec.has_lz4,
        "zstd": kafka_python_codec.has_zstd,
    }[codec]()


def produce(
    client: str,
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    *,
    codec: str = "none",
    idempotent: bool = False,
    client_id: str = "icefloe-tests",
) -> None:
    """Write ``messages`` to their partitions, in order; fail on any delivery error."""
    producers: dict[str, Callable[..., None]] = {
        "confluent": _produce_confluent,
        "kafka-python": _produce_kafka_python,
        "aiokafka": lambda *a, **k: asyncio.run(_produce_aiokafka(*a, **k)),
    }
    producers[client](bootstrap, topic, messages, codec, idempotent, client_id)


def consume(
    client: str,
    bootstrap: str,
    topic: str,
    counts: dict[int, int],
    *,
    client_id: str = "icefloe-tests",
) -> dict[int, list[Message]]:
    """Read ``counts[p]`` records from the start of each partition ``p``, in order."""
    consumers: dict[str, Callable[..., dict[int, list[Message]]]] = {
        "confluent": _consume_confluent,
        "kafka-python": _consume_kafka_python,
        "aiokafka": lambda *a: asyncio.run(_consume_aiokafka(*a)),
    }
    return consumers[client](bootstrap, topic, counts, client_id)


# --- confluent-kafka -------------------------------------------------------------------------


def _produce_confluent(
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    codec: str,
    idempotent: bool,
    client_id: str,
) -> None:
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "compression.type": codec,
            "enable.idempotence": idempotent,
            "linger.ms": 5,
            "acks": "all",
        }
    )
    errors: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            errors.append(error)

    for m in messages:
        while True:
            try:
                producer.produce(
                    topic,
                    key=m.key,
                    value=m.value,
                    partition=m.partition,
                    headers=list(m.headers),
                    timestamp=m.timestamp,
                    on_delivery=delivered,
                )
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(READ_TIMEOUT_S) == 0, "confluent-kafka did not deliver everything"
    assert not errors, errors[:5]


def _consume_confluent(
    bootstrap: str, topic: str, counts: dict[int, int], client_id: str
) -> dict[int, list[Message]]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": "unused-manual-assignment",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in counts])
        out: dict[int, list[Message]] = {p: [] for p in counts}
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not _complete(out, counts) and time.monotonic() < deadline:
            for record in consumer.consume(num_messages=10_000, timeout=0.5):
                if record.error() is not None:
                    raise AssertionError(f"confluent-kafka consumer error: {record.error()}")
                out[record.partition()].append(
                    Message(
                        record.partition(),
                        record.offset(),
                        record.key(),
                        record.value(),
                        tuple(record.headers() or ()),
                        record.timestamp()[1],
                    )
                )
        return out
    finally:
        consumer.close()


# --- kafka-python ----------------------------------------------------------------------------


def _produce_kafka_python(
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    codec: str,
    idempotent: bool,
    client_id: str,
) -> None:
    producer = kafka.KafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        compression_type=None if codec == "none" else codec,
        enable_idempotence=idempotent,
        acks="all",
        linger_ms=5,
        batch_size=256 << 10,
    )
    try:
        futures = [
            producer.send(
                topic,
                key=m.key,
                value=m.value,
                partition=m.partition,
                headers=list(m.headers),
                timestamp_ms=m.timestamp,
            )
            for m in messages
        ]
        producer.flush(READ_TIMEOUT_S)
        for future in futures:
            future.get(timeout=0)  # raises the delivery error, if any
    finally:
        producer.close()


def _consume_kafka_python(
    bootstrap: str, topic: str, counts: dict[int, int], client_id: str
) -> dict[int, list[Message]]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        partitions = [kafka.TopicPartition(topic, p) for p in counts]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        out: dict[int, list[Message]] = {p: [] for p in counts}
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not _complete(out, counts) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500, max_records=10_000).items():
                out[tp.partition].extend(
                    Message(
                        tp.partition,
                        r.offset,
                        r.key,
                        r.value,
                        tuple(r.headers),
                        r.timestamp,
                    )
                    for r in records
                )
        return out
    finally:
        consumer.close()


# --- aiokafka --------------------------------------------------------------------------------


async def _produce_aiokafka(
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    codec: str,
    idempotent: bool,
    client_id: str,
) -> None:
    producer = aiokafka.AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        compression_type=None if codec == "none" else codec,
        enable_idempotence=idempotent,
        acks="all",
        linger_ms=5,
        max_batch_size=256 << 10,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                topic,
                key=m.key,
                value=m.value,
                partition=m.partition,
                headers=list(m.headers),
                timestamp_ms=m.timestamp,
            )
            for m in messages
        ]
        await producer.flush()
        await asyncio.gather(*futures)  # raises the delivery error, if any
    finally:
        await producer.stop()


async def _consume_aiokafka(
    bootstrap: str, topic: str, counts: dict[int, int], client_id: str
) -> dict[int, list[Message]]:
    consumer = aiokafka.AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        partitions = [aiokafka.TopicPartition(topic, p) for p in counts]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        out: dict[int, list[Message]] = {p: [] for p in counts}
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not _complete(out, counts) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=10_000)
            for tp, records in batches.items():
                out[tp.partition].extend(
                    Message(
                        tp.partition,
                        r.offset,
                        r.key,
                        r.value,
                        tuple(r.headers),
                        r.timestamp,
                    )
                    for r in records
                )
        return out
    finally:
        await consumer.stop()


def _complete(out: dict[int, list[Message]], counts: dict[int, int]) -> bool:
    return all(len(out[p]) >= n for p, n in counts.items())
