"""One member of a transactional consume-transform-produce pipeline (confluent-kafka), run in a
process of its own so that a test can pause it (SIGSTOP), kill it (SIGKILL) or stop it
(SIGTERM: it finishes its transaction and leaves the group):

    python -m tests.support.eos_worker BOOTSTRAP GROUP TRANSACTIONAL_ID PROTOCOL IN OUT
        [--pause-at produced:N | sent:N]

It reads IN read_committed and writes each record to OUT, its value prefixed with ``out-``
(headers name the member, its transaction and the input's partition and offset, for a
failure's post-mortem), committing the offsets it read in the same transaction, as an
exactly-once application does:

- the offsets go with the group metadata of the moment the transaction began, so a member
  fenced since (a rebalance moved its partitions while it was paused) cannot commit them;
- a transaction is committed before its partitions are revoked, and aborted when they are lost;
- after an abort it reads again from where the aborted transaction began; after a fatal error
  (or a seek the client refuses) it takes a new producer and joins the group afresh, reading
  from the committed offsets, since it cannot tell how its transaction ended;
- a record the client hands out again at an offset this member already passed is skipped
  (librdkafka's consumer protocol now and then does so after a reconciliation).

``--pause-at produced:N`` stops the process itself (SIGSTOP) in the N-th transaction whose
records are produced, before the offsets are sent; ``sent:N`` in the N-th whose offsets are
sent, before the commit: a pause the test then ends with SIGCONT, or a kill it makes
mid-transaction.

It prints one JSON object per line: ``assigned``/``revoked``/``lost`` (partitions), ``start``
(the first offset it reads of a partition it got), ``begun`` (transaction), ``sending`` and
``committing`` (transaction: the step it is in, should it hang there), ``sent`` and
``committed`` (transaction, partitions, records), ``aborted`` and ``new-producer``
(transaction, error, partitions), ``paused``, ``seek-failed``, ``rejoined``, ``stopping`` (its loop
saw SIGTERM), ``closing`` (done, leaving the group), ``stopped`` (records skipped as handed out
again).

``ICEFLOE_EOS_DEBUG`` set to librdkafka debug contexts (``eos,cgrp,topic``) writes the
clients' debug lines to the member's log.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

BATCH_RECORDS = 50
BATCH_SECONDS = 0.25
SESSION_TIMEOUT_MS = 6000
TRANSACTION_TIMEOUT_MS = 30_000
"""Longer than any pause a test makes: a paused member's transaction is still its own after."""
CALL_TIMEOUT_S = 30
COMMITTED_TIMEOUT_S = 90
"""Past the transaction timeout and the broker's sweep of timed-out transactions: the longest
a partition's offsets stay pending."""
DEBUG = os.environ.get("ICEFLOE_EOS_DEBUG")


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


@dataclass
class Transaction:
    number: int
    group_metadata: Any
    first: dict[int, int] = field(default_factory=dict)
    """Per partition, the offset of the first record read in the transaction."""
    next: dict[int, int] = field(default_factory=dict)
    """Per partition, the offset after the last record read in the transaction."""
    records: int = 0
    began: float = field(default_factory=time.monotonic)


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pause_at: tuple[str, int] | None = None
        if args.pause_at:
            step, number = args.pause_at.split(":")
            self.pause_at = (step, int(number))
        self.stop = False
        self.owned: set[int] = set()
        self.expected: dict[int, int] = {}
        """Per owned partition, the offset of the next record to process."""
        self.txn: Transaction | None = None
        self.count = 0
        self.skipped = 0
        conf: dict[str, Any] = {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "group.protocol": args.protocol,
            "client.id": args.transactional_id,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
        if args.protocol == "classic":
            conf |= {"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 500}
        if DEBUG:
            conf["debug"] = DEBUG
        self.conf = conf
        self.consumer = Consumer(conf)
        self.producer = self.new_producer()
        self.rewound: dict[int, int] = {}
        """Per partition, where it was sought back to: records before the seek may still come
        in the batch at hand, and are not the next ones."""
        self.rejoin = False
        self.reached: Counter[str] = Counter()
        """How many transactions reached each step where it may pause."""

    def new_consumer(self) -> None:
        """Leave the group and join again: the partitions it gets start at the committed
        offsets."""
        self.consumer.close()
        self.owned.clear()
        self.expected.clear()
        self.rewound.clear()
        self.rejoin = False
        self.consumer = Consumer(self.conf)
        self.subscribe()
        emit("rejoined")

    def subscribe(self) -> None:
        self.consumer.subscribe(
            [self.args.input], on_assign=self.assigned, on_revoke=self.revoked, on_lost=self.lost
        )

    def new_producer(self) -> Producer:
        conf = {
            "bootstrap.servers": self.args.bootstrap,
            "transactional.id": self.args.transactional_id,
            "transaction.timeout.ms": self.args.transaction_timeout_ms,
            "linger.ms": 5,
        }
        if DEBUG:
            conf["debug"] = DEBUG
        producer = Producer(conf)
        retry(lambda: producer.init_transactions(CALL_TIMEOUT_S))
        return producer

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        self.subscribe()
        heard_stop = False
        while True:
            if self.stop and not heard_stop:
                heard_stop = True
                emit("stopping")  # not from the signal handler: it may interrupt a print
            if self.rejoin:
                self.new_consumer()
            for message in self.consumer.consume(100, 0.1):
                if message.error() is None and not self.rejoin:
                    self.process(message)
            txn = self.txn
            if txn is not None and (
                self.stop
                or txn.records >= BATCH_RECORDS
                or time.monotonic() - txn.began >= BATCH_SECONDS
            ):
                self.finish()
            if self.stop and self.txn is None:
                break
        emit("closing")  # its work is committed; what is left is leaving the group
        self.consumer.close()
        emit("stopped", skipped=self.skipped)

    def process(self, message: Any) -> None:
        partition, offset = message.partition(), message.offset()
        expected = self.expected.get(partition, offset)
        if partition not in self.owned or offset < expected:
            self.skipped += 1
            return
        if partition not in self.expected:
            emit("start", partition=partition, offset=offset)  # its first record here
        if partition in self.rewound:
            if offset != self.rewound[partition]:
                return  # read before the rewind, handed out in the same batch: not yet
            del self.rewound[partition]
        if self.txn is None:
            self.count += 1
            self.producer.begin_transaction()
            self.txn = Transaction(self.count, self.consumer.consumer_group_metadata())
            emit("begun", txn=self.count)
        txn = self.txn
        txn.first.setdefault(partition, offset)
        txn.next[partition] = self.expected[partition] = offset + 1
        txn.records += 1
        origin = [
            ("member", self.args.transactional_id.encode()),
            ("txn", str(txn.number).encode()),
            ("input", f"{partition}:{offset}".encode()),
            ("pid", str(os.getpid()).encode()),
        ]
        try:
            self.producer.produce(
                self.args.output,
                key=message.key(),
                value=b"out-" + message.value(),
                headers=origin,
            )
        except KafkaException as exc:  # the transaction failed already
            self.failed(txn, exc.args[0])
            self.txn = None

    def finish(self) -> None:
        """Commit the transaction; abort it if the group or the coordinator refuses."""
        txn = self.txn
        assert txn is not None
        offsets = [TopicPartition(self.args.input, p, o) for p, o in sorted(txn.next.items())]
        self.pause_if("produced", txn)
        try:
            emit("sending", txn=txn.number, partitions=sorted(txn.next))
            retry(
                lambda: self.producer.send_offsets_to_transaction(
                    offsets, txn.group_metadata, CALL_TIMEOUT_S
                )
            )
            emit("sent", txn=txn.number, partitions=sorted(txn.next))
            self.pause_if("sent", txn)
            emit("committing", txn=txn.number)
            retry(lambda: self.producer.commit_transaction(CALL_TIMEOUT_S))
        except KafkaException as exc:
            self.failed(txn, exc.args[0])
        else:
            emit("committed", txn=txn.number, partitions=sorted(txn.next), records=txn.records)
        self.txn = None

    def failed(self, txn: Transaction, error: KafkaError) -> None:
        """The transaction did not commit: abort it and read its records again. A producer that
        is fenced, or whose abort fails, cannot tell how the transaction ended (a broker may
        have decided the commit before it died): then a new producer, and the group joined
        afresh, reading from the committed offsets, which say."""
        if error.txn_requires_abort():
            try:
                retry(lambda: self.producer.abort_transaction(CALL_TIMEOUT_S))
            except KafkaException as exc:
                error = exc.args[0]
            else:
                emit("aborted", txn=txn.number, error=error.name(), partitions=sorted(txn.next))
                self.rewind(txn)
                return
        emit("new-producer", txn=txn.number, error=error.name(), partitions=sorted(txn.next))
        self.producer = self.new_producer()  # which ends what the old one left open
        self.rejoin = True

    def rewind(self, txn: Transaction) -> None:
        for partition, first in txn.first.items():
            if partition in self.owned:
                self.expected[partition] = self.rewound[partition] = first
                try:
                    self.consumer.seek(TopicPartition(self.args.input, partition, first))
                except KafkaException as exc:
                    # Reading on from here would lose the aborted records: join afresh, from
                    # the group's committed offsets.
                    emit("seek-failed", partition=partition, error=exc.args[0].name())
                    self.rejoin = True

    def abort(self) -> None:
        txn = self.txn
        assert txn is not None
        try:
            retry(lambda: self.producer.abort_transaction(CALL_TIMEOUT_S))
            emit("aborted", txn=txn.number, error="partitions lost", partitions=sorted(txn.next))
        except KafkaException as exc:
            error = exc.args[0].name()
            emit("new-producer", txn=txn.number, error=error, partitions=sorted(txn.next))
            self.producer = self.new_producer()
            self.rejoin = True
        self.txn = None

    def pause_if(self, step: str, txn: Transaction) -> None:
        self.reached[step] += 1
        if self.pause_at == (step, self.reached[step]):
            emit("paused", txn=txn.number, step=step, partitions=sorted(txn.next))
            os.kill(os.getpid(), signal.SIGSTOP)

    # --- rebalances -------------------------------------------------------------------------

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Start the partitions at their stable committed offsets, asked for here rather than
        left to the client: librdkafka (2.x) starts a partition whose committed offset was
        unstable (UNSTABLE_OFFSET_COMMIT: a transaction's offsets pending) from
        ``auto.offset.reset`` when its assignment changed while it asked, reading the
        partition again from the start. ``committed()`` waits until they are stable."""
        self.owned |= {tp.partition for tp in partitions}
        emit("assigned", partitions=sorted(tp.partition for tp in partitions))
        if partitions:
            starts = consumer.committed(partitions, COMMITTED_TIMEOUT_S)
            for tp in starts:
                if tp.error is not None:
                    raise KafkaException(tp.error)
                if tp.offset < 0:  # nothing committed yet
                    tp.offset = OFFSET_BEGINNING
            if self.args.protocol == "classic":
                consumer.assign(starts)
            else:
                consumer.incremental_assign(starts)

    def revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.txn is not None:
            self.finish()  # what it read of them is committed before another member reads on
        self.drop(partitions)
        emit("revoked", partitions=sorted(tp.partition for tp in partitions))

    def lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self.txn is not None:
            self.abort()  # another member may read them already
        self.drop(partitions)
        emit("lost", partitions=sorted(tp.partition for tp in partitions))

    def drop(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.owned.discard(tp.partition)
            self.expected.pop(tp.partition, None)
            self.rewound.pop(tp.partition, None)


def retry(call: Any, attempts: int = 20) -> None:
    """``call()``, again while it fails with a retriable error."""
    for attempt in range(attempts):
        try:
            call()
            return
        except KafkaException as exc:
            if not exc.args[0].retriable() or attempt == attempts - 1:
                raise
            time.sleep(0.2)


def die_with_parent() -> None:
    """SIGKILL when the process (thread) that started this one ends, so that a test that fails
    or is interrupted leaves no member behind."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def main() -> None:
    die_with_parent()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("bootstrap", "group", "transactional_id", "protocol", "input", "output"):
        parser.add_argument(name)
    parser.add_argument("--pause-at")
    parser.add_argument("--transaction-timeout-ms", type=int, default=TRANSACTION_TIMEOUT_MS)
    args = parser.parse_args()
    stopping: list[Worker] = []

    def stop(*_: object) -> None:
        if not stopping:
            sys.exit(0)  # before it joined: nothing to finish
        stopping[0].stop = True

    signal.signal(signal.SIGTERM, stop)  # at once: a test may stop it while it starts
    stopping.append(Worker(args))
    stopping[0].run()
    sys.exit(0)


if __name__ == "__main__":
    main()
