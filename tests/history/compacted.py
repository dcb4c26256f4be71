"""A compacted topic in a history run: keyed sends to a topic with ``cleanup.policy=compact``,
and after the faults, a read of the whole topic checked against what was sent.

What Kafka promises a reader of a compacted topic that reads to the end: for every record key,
the latest record written with that key (or one written after it) is there; every record keeps
the offset it was written at, in order; compaction only ever removes a record that a later one
of the same key supersedes. The check (:func:`check_compacted`) looks for the breaches:

- ``lost-latest``: a key whose latest acknowledged record is neither read nor superseded by a
  record of that key read at a later offset;
- ``moved``: a record read at another offset than the one its send was acknowledged at;
- ``phantom``: a record read that no send wrote (or with another record key than it was sent
  with);
- ``duplicate``: a value read twice;
- ``nonmonotonic``: offsets read out of order.

Values are unique per partition, so a read names the send it saw. The sends are kept in a file
of their own (``compacted.jsonl``: one line per send, with its times and outcome), beside the
history, whose checker knows nothing of record keys.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from tests.history.recorder import FAIL, INFO, OK
from tests.history.workload import Sender, Setup, end_offset, key, send_and_wait

TOPIC: Final = "history-compacted"
RECORD_KEYS: Final = 8
"""Record keys per partition: few, so that most records are soon superseded."""
TOPIC_CONFIG: Final = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": "0.01",
    "min.compaction.lag.ms": "0",
}
"""Cleaned as soon as compaction has turned records into data files."""


@dataclass(frozen=True, slots=True)
class KeyedSend:
    partition: int
    record_key: str
    value: int
    invoked: float
    completed: float
    outcome: str
    offset: int | None = None
    error: str | None = None


@dataclass
class CompactedLog:
    """The sends to the compacted topic, kept in memory while the run lasts (thread-safe)."""

    path: Path
    sends: list[KeyedSend] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, send: KeyedSend) -> None:
        with self._lock:
            self.sends.append(send)

    def close(self) -> list[KeyedSend]:
        with self._lock, self.path.open("w") as out:
            for send in sorted(self.sends, key=lambda s: s.invoked):
                out.write(json.dumps(asdict(send)) + "\n")
            return list(self.sends)


class CompactedSender(Sender):
    """An idempotent producer of keyed records to the compacted topic, one per operation."""

    def __init__(self, name: str, setup: Setup, seed: int, log: CompactedLog) -> None:
        super().__init__(name, setup, seed)
        self._log = log

    def _send(self, producer: Producer) -> bool:
        partition = self.random.randrange(self.partitions)
        record_key = f"k{self.random.randrange(RECORD_KEYS)}"
        value = self.values.next(key(TOPIC, partition))
        invoked = self.history.now()
        outcome = send_and_wait(
            producer, TOPIC, partition, str(value).encode(), record_key.encode()
        )
        error, message = outcome or (None, None)
        if message is not None and error is None:
            kind, offset = OK, message.offset()
        else:
            kind, offset = INFO, None  # unknown: an idempotent producer that gave up
        self._log.record(
            KeyedSend(
                partition,
                record_key,
                value,
                invoked,
                self.history.now(),
                kind,
                offset,
                None if error is None else str(error),
            )
        )
        return kind == OK


def read_compacted(
    setup: Setup, within: float = 120.0
) -> tuple[dict[int, list[tuple[int, str, int]]], dict[int, tuple[int | None, int]]]:
    """Every partition of the compacted topic from its start to its end: partition →
    [(offset, record key, value)], and the partitions not read to their end within
    ``within`` seconds → (the last offset read, the end)."""
    read: dict[int, list[tuple[int, str, int]]] = {p: [] for p in range(setup.partitions)}
    consumer = Consumer(
        {
            **setup.client,
            "group.id": "history-compacted-read",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        ends = {}
        for p in range(setup.partitions):
            ends[p] = end_offset(consumer, TopicPartition(TOPIC, p))
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(setup.partitions)])
        unfinished = {p for p, end in ends.items() if end > 0}
        deadline = time.monotonic() + within
        while unfinished and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.5):
                error = m.error()
                if error is None:
                    record_key = (m.key() or b"").decode()
                    read[m.partition()].append((m.offset(), record_key, int(m.value() or b"-1")))
                    if m.offset() >= ends[m.partition()] - 1:
                        unfinished.discard(m.partition())
                elif (
                    error.code() == KafkaError._PARTITION_EOF and m.offset() >= ends[m.partition()]
                ):
                    unfinished.discard(m.partition())
        stuck = {p: (read[p][-1][0] if read[p] else None, ends[p]) for p in unfinished}
    finally:
        consumer.close()
    return read, stuck


def check_compacted(
    sends: list[KeyedSend], read: dict[int, list[tuple[int, str, int]]]
) -> dict[str, Any]:
    """The anomalies of the module docstring (each with up to ten examples) and counts."""
    anomalies: dict[str, list[str]] = {
        kind: [] for kind in ("lost-latest", "moved", "phantom", "duplicate", "nonmonotonic")
    }
    by_value = {(s.partition, s.value): s for s in sends if s.outcome != FAIL}
    latest: dict[tuple[int, str], KeyedSend] = {}
    for send in sends:
        if send.outcome == OK and send.offset is not None:
            where = (send.partition, send.record_key)
            if where not in latest or send.offset > (latest[where].offset or -1):
                latest[where] = send
    last_read: dict[tuple[int, str], int] = {}
    for partition, records in read.items():
        values = Counter(value for _, _, value in records)
        anomalies["duplicate"] += [f"{partition}:{v}" for v, n in values.items() if n > 1]
        offsets = [offset for offset, _, _ in records]
        if offsets != sorted(set(offsets)):
            anomalies["nonmonotonic"].append(f"partition {partition}")
        for offset, record_key, value in records:
            sent = by_value.get((partition, value))
            if sent is None or sent.record_key != record_key:
                anomalies["phantom"].append(f"{partition}:{offset} {record_key}={value}")
                continue
            if sent.offset is not None and sent.offset != offset:
                anomalies["moved"].append(
                    f"{partition}:{value} sent at {sent.offset}, read at {offset}"
                )
            where = (partition, record_key)
            last_read[where] = max(offset, last_read.get(where, -1))
    for (partition, record_key), send in sorted(latest.items()):
        assert send.offset is not None
        if last_read.get((partition, record_key), -1) < send.offset:
            anomalies["lost-latest"].append(
                f"{partition}:{record_key}: latest acknowledged at {send.offset} (value "
                f"{send.value}), last read at {last_read.get((partition, record_key))}"
            )
    read_values = {(p, value) for p, records in read.items() for _, _, value in records}
    acknowledged = [s for s in sends if s.outcome == OK]
    return {
        "valid": not any(anomalies.values()),
        "anomalies": {k: {"count": len(v), "examples": v[:10]} for k, v in anomalies.items()},
        "acknowledged": len(acknowledged),
        "read": len(read_values),
        "removed_by_compaction": sum(
            1 for s in acknowledged if (s.partition, s.value) not in read_values
        ),
    }
