"""Kafka transactions through real clients against `icefloe serve`: a transactional
confluent-kafka producer commits and aborts, interleaved with a plain producer; read_committed
consumers see committed records only, read_uncommitted ones everything; offsets committed in a
transaction apply only when it commits; a new producer instance fences the old one; a
transaction left open past its timeout is aborted; admin tools describe and list them; a Java
exactly-once pipeline survives SIGKILL; the tables hold committed records only, once."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.integration.test_compaction_clients import compacted, tables
from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.kafka_jvm import TRANSACTIONS, KafkaTools, compile_java, java_executable, rows
from tests.support.table_readers import duckdb_rows

CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(tmp_path_factory.mktemp("transactions") / "data", brokers=2)
    try:
        yield running
    finally:
        running.stop()


def create(cluster: RunningIcefloe, topic: str, partitions: int = 2) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(topic, partitions)])[topic].result(30)


def transactional(cluster: RunningIcefloe, transactional_id: str, **settings: Any) -> Producer:
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id, **settings}
    )
    producer.init_transactions(30)
    return producer


def read_all(
    cluster: RunningIcefloe,
    topic: str,
    isolation: str,
    partitions: int = 2,
    idle_s: float | None = None,
) -> list[bytes]:
    """Every value a consumer with ``isolation`` reads, from the start: until it is idle for
    ``idle_s`` if given, else until it has fetched each partition to its end (the consumer's
    end-of-partition event) and that end is the log end as it stood when the read began. A
    read_committed consumer gets there only once no open transaction holds a partition back,
    so a last stable offset that never moves fails here, and a slow read does not pass for the
    end of the data."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"reader-{time.monotonic_ns()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    assigned = [TopicPartition(topic, p, 0) for p in range(partitions)]
    ends = _log_ends(cluster, assigned)
    consumer.assign(assigned)
    values: list[bytes] = []
    fetched_to = [-1] * partitions  # where each partition's last end-of-partition event was
    last = time.monotonic()
    deadline = last + 60
    while True:
        idle = time.monotonic() - last
        if idle_s is not None and idle >= idle_s:
            break
        if idle_s is None and _reached(fetched_to, ends):
            break
        assert time.monotonic() < deadline, (
            f"read {values}, fetched to {fetched_to}, but the broker let it read to "
            f"{_readable_to(consumer, assigned)} of the log ends {ends}"
        )
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                fetched_to[message.partition()] = message.offset()
            continue
        values.append(message.value())
        last = time.monotonic()
    consumer.close()
    return values


def _log_ends(cluster: RunningIcefloe, assigned: list[TopicPartition]) -> list[int]:
    """The partitions' high watermarks."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": "watermarks",
            # A read_committed query (librdkafka's default) answers last stable offsets.
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        return [consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in assigned]
    finally:
        consumer.close()


def _reached(offsets: list[int], ends: list[int]) -> bool:
    return all(offset >= end for offset, end in zip(offsets, ends, strict=True))


def _readable_to(consumer: Consumer, assigned: list[TopicPartition]) -> list[int]:
    """Where the broker says each partition ends for the consumer: the last stable offset for
    read_committed, the high watermark otherwise."""
    return [consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in assigned]


def test_read_committed_sees_committed_records_only(cluster: RunningIcefloe) -> None:
    create(cluster, "txn-basic")
    producer = transactional(cluster, "basic")
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    for round_ in range(3):
        producer.begin_transaction()
        for p in range(2):
            producer.produce("txn-basic", f"commit-{round_}-{p}".encode(), partition=p)
        plain.produce("txn-basic", f"plain-{round_}".encode(), partition=round_ % 2)
        assert plain.flush(30) == 0
        producer.commit_transaction(30)
        producer.begin_transaction()
        producer.produce("txn-basic", f"abort-{round_}".encode(), partition=round_ % 2)
        assert producer.flush(30) == 0
        producer.abort_transaction(30)

    committed = read_all(cluster, "txn-basic", "read_committed")
    everything = read_all(cluster, "txn-basic", "read_uncommitted")

    expected = {f"commit-{r}-{p}".encode() for r in range(3) for p in range(2)}
    expected |= {f"plain-{r}".encode() for r in range(3)}
    assert sorted(committed) == sorted(expected)
    assert sorted(everything) == sorted(expected | {f"abort-{r}".encode() for r in range(3)})


def test_an_open_transaction_holds_read_committed_back_until_it_commits(
    cluster: RunningIcefloe,
) -> None:
    create(cluster, "txn-open", 1)
    producer = transactional(cluster, "open")
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    producer.begin_transaction()
    producer.produce("txn-open", b"in-flight", partition=0)
    assert producer.flush(30) == 0
    plain.produce("txn-open", b"after", partition=0)
    assert plain.flush(30) == 0
    # The plain record comes after the open transaction's: read_committed waits for both.
    assert read_all(cluster, "txn-open", "read_committed", 1, idle_s=2) == []
    assert read_all(cluster, "txn-open", "read_uncommitted", 1) == [b"in-flight", b"after"]
    producer.commit_transaction(30)
    assert read_all(cluster, "txn-open", "read_committed", 1) == [b"in-flight", b"after"]


def test_offsets_sent_in_a_transaction_apply_only_when_it_commits(
    cluster: RunningIcefloe,
) -> None:
    create(cluster, "txn-offsets", 1)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "txn-group"})
    group = consumer.consumer_group_metadata()
    producer = transactional(cluster, "offsets")
    partition = TopicPartition("txn-offsets", 0)

    def committed() -> int:
        return int(consumer.committed([partition], timeout=30)[0].offset)

    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition("txn-offsets", 0, 7)], group, 30)
    producer.abort_transaction(30)
    assert committed() < 0  # nothing committed
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition("txn-offsets", 0, 5)], group, 30)
    producer.commit_transaction(30)
    assert committed() == 5
    consumer.close()


def test_a_new_instance_fences_the_old_one(cluster: RunningIcefloe) -> None:
    create(cluster, "txn-fence", 1)
    old = transactional(cluster, "fenced-id")
    old.begin_transaction()
    old.produce("txn-fence", b"zombie-1", partition=0)
    assert old.flush(30) == 0
    new = transactional(cluster, "fenced-id")  # aborts what the old one left open
    new.begin_transaction()
    new.produce("txn-fence", b"new-1", partition=0)
    new.commit_transaction(30)
    old.produce("txn-fence", b"zombie-2", partition=0)
    with pytest.raises(KafkaException) as fenced:
        old.commit_transaction(30)
    assert fenced.value.args[0].code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )
    assert read_all(cluster, "txn-fence", "read_committed", 1) == [b"new-1"]


def test_a_transaction_left_open_is_aborted_after_its_timeout(cluster: RunningIcefloe) -> None:
    create(cluster, "txn-timeout", 1)
    producer = transactional(cluster, "forgotten", **{"transaction.timeout.ms": 2000})
    producer.begin_transaction()
    producer.produce("txn-timeout", b"forgotten", partition=0)
    assert producer.flush(30) == 0
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    plain.produce("txn-timeout", b"later", partition=0)
    assert plain.flush(30) == 0
    # Every broker sweeps for timed-out transactions about every 10 s.
    deadline = time.monotonic() + 40
    seen: list[bytes] = []
    while time.monotonic() < deadline and not seen:
        seen = read_all(cluster, "txn-timeout", "read_committed", 1, idle_s=1)
    assert seen == [b"later"]


def test_kafka_transactions_lists_and_describes_them(cluster: RunningIcefloe) -> None:
    create(cluster, "txn-admin", 1)
    producer = transactional(cluster, "described")
    producer.begin_transaction()
    producer.produce("txn-admin", b"x", partition=0)
    assert producer.flush(30) == 0
    java_executable()  # fails naming the fix if Java or the jars are missing
    tools = KafkaTools(cluster.bootstrap)
    listed = {row[0]: row for row in rows(tools.run(TRANSACTIONS, "list"))[1:]}
    assert listed["described"][-1] == "Ongoing"
    header, described = rows(tools.run(TRANSACTIONS, "describe", "--transactional-id", "described"))
    state = dict(zip(header, described, strict=False))
    assert state["TransactionState"] == "Ongoing"
    assert "txn-admin-0" in described[-1]
    header, *states = rows(
        tools.run(TRANSACTIONS, "describe-producers", "--topic", "txn-admin", "--partition", "0")
    )
    (state_row,) = states
    assert dict(zip(header, state_row, strict=False))["CurrentTransactionStartOffset"] == "0"
    producer.commit_transaction(30)
    header, described = rows(tools.run(TRANSACTIONS, "describe", "--transactional-id", "described"))
    assert dict(zip(header, described, strict=False))["TransactionState"] == "CompleteCommit"


JAVA_SOURCE = Path(__file__).parent / "java" / "EosPipeline.java"


def test_a_java_consume_transform_produce_loop_killed_and_restarted_is_exactly_once(
    cluster: RunningIcefloe, tmp_path: Path
) -> None:
    pipeline = compile_java(JAVA_SOURCE, tmp_path)
    create(cluster, "in")
    create(cluster, "out")
    inputs = [f"value-{i}" for i in range(400)]
    plain = Producer({"bootstrap.servers": cluster.bootstrap})
    for i, value in enumerate(inputs):
        plain.produce("in", value.encode(), key=str(i).encode())
    assert plain.flush(30) == 0
    command = [*pipeline, cluster.bootstrap, "eos-1"]

    first = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert first.stdout is not None
    for line in first.stdout:
        if line.startswith("committed") and int(line.split()[1]) >= 100:
            break
    first.kill()  # mid-stream: a transaction may be open
    first.wait(30)
    second = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert second.returncode == 0, second.stdout + second.stderr

    outputs = read_all(cluster, "out", "read_committed")
    assert sorted(outputs) == sorted(v.upper().encode() for v in inputs)


def test_tables_hold_committed_records_once_and_no_markers(tmp_path: Path) -> None:
    data = tmp_path / "data"
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    try:
        create(running, "ledger")
        producer = transactional(running, "ledger-writer")
        plain = Producer({"bootstrap.servers": running.bootstrap})
        for round_ in range(4):
            producer.begin_transaction()
            for p in range(2):
                producer.produce("ledger", f"kept-{round_}-{p}".encode(), partition=p)
            plain.produce("ledger", f"plain-{round_}".encode(), partition=round_ % 2)
            assert plain.flush(30) == 0
            if round_ % 2:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        before = read_all(running, "ledger", "read_committed")
    finally:
        assert running.stop() == 0
    expected = sorted(
        [f"kept-{r}-{p}".encode() for r in (0, 2) for p in range(2)]
        + [f"plain-{r}".encode() for r in range(4)]
    )
    assert sorted(before) == expected

    running = compacted(data)  # the same log, compacted into the tables now
    try:
        # Served from Parquet now: the same committed records, and no markers.
        assert sorted(read_all(running, "ledger", "read_committed")) == expected
        assert sorted(read_all(running, "ledger", "read_uncommitted")) == expected
        delta = next(row for row in tables(running) if row["format"] == "delta")
        rows = duckdb_rows(f"delta_scan('{delta['location']}')")
    finally:
        assert running.stop() == 0
    assert sorted(row[3] for row in rows) == expected


def test_the_broker_that_wrote_a_transactional_log_reads_it_after_compaction(
    tmp_path: Path,
) -> None:
    """That broker reads what compaction just moved from the WAL entries the swap replaced
    (their objects outlive it): aborted batches and markers are there again, so a
    read_committed consumer must still be told to skip them. Started again, it reads the data
    files, which hold the committed records only."""
    env = {
        "ICEFLOE_COMPACTOR__MAX_AGE_S": "0",
        "ICEFLOE_COMPACTOR__MIN_AGE_S": "0",
        "ICEFLOE_COMPACTOR__INTERVAL_S": "0.3",
    }
    running = start_icefloe(tmp_path / "data", env=env)
    try:
        create(running, "ledger", partitions=1)
        producer = transactional(running, "ledger-writer")
        for round_ in range(4):
            producer.begin_transaction()
            producer.produce("ledger", f"tx-{round_}".encode(), partition=0)
            assert producer.flush(30) == 0  # in the log before the abort, not purged by it
            if round_ % 2:
                producer.abort_transaction(30)
            else:
                producer.commit_transaction(30)
        deadline = time.monotonic() + 120
        while not [row for row in tables(running) if row["lag_records"] == 0]:
            assert time.monotonic() < deadline, "compaction did not catch up"
            time.sleep(0.5)
        assert read_all(running, "ledger", "read_committed", partitions=1) == [b"tx-0", b"tx-2"]
        # The aborted records are in the log again, as they are in Kafka's.
        assert read_all(running, "ledger", "read_uncommitted", partitions=1) == [
            b"tx-0",
            b"tx-1",
            b"tx-2",
            b"tx-3",
        ]
    finally:
        assert running.stop() == 0
    running = start_icefloe(tmp_path / "data", env=env)
    try:
        assert read_all(running, "ledger", "read_committed", partitions=1) == [b"tx-0", b"tx-2"]
        assert read_all(running, "ledger", "read_uncommitted", partitions=1) == [b"tx-0", b"tx-2"]
    finally:
        assert running.stop() == 0


def test_a_broker_killed_mid_stream_leaves_every_transaction_whole(tmp_path: Path) -> None:
    # The killed broker's producer leases pass to the other after twice their length: 6 s
    # rather than the default 20 keeps the test short and the takeover the same.
    env = {"ICEFLOE_STORAGE__PRODUCER_LEASE_S": "3"}
    running = start_icefloe(tmp_path / "data", brokers=2, env=env)
    try:
        create(running, "chaos")
        producer = transactional(running, "chaos-writer")
        committed: list[bytes] = []
        for n in range(30):
            values = [f"t{n}-{i}".encode() for i in range(4)]
            producer.begin_transaction()
            for i, value in enumerate(values):
                producer.produce("chaos", value, partition=i % 2)
            if n in (8, 16):  # records in flight, the commit to come: serve restarts it
                os.kill(broker_pids(running)[n // 8 - 1], signal.SIGKILL)
            if _commit(producer):
                committed += values
        assert len(committed) >= 4 * 20  # most transactions made it through the kill
        seen = read_all(running, "chaos", "read_committed")
    finally:
        running.stop()
    assert sorted(seen) == sorted(committed)  # each committed record once, nothing else


def _commit(producer: Producer) -> bool:
    """Commit as an application should: retry what may be retried, abort what must be."""
    for _ in range(10):
        try:
            producer.commit_transaction(30)
            return True
        except KafkaException as exc:
            error = exc.args[0]
            if error.retriable():
                continue
            if error.txn_requires_abort():
                producer.abort_transaction(30)
                return False
            raise
    raise AssertionError("commit kept failing")


def test_a_range_holding_only_an_aborted_transaction_is_compacted_and_stops_nothing(
    tmp_path: Path,
) -> None:
    """Its records and marker leave no rows: no table is handed an empty file (Iceberg
    refuses one), so both tables stay at one commit, the partition keeps every offset, and
    the next records of the topic and of other topics still reach the tables."""
    data = tmp_path / "data"
    running = start_icefloe(data, env={"ICEFLOE_COMPACTOR__ENABLED": "false"})
    try:
        create(running, "voided", partitions=1)
        create(running, "beside", partitions=1)
        producer = transactional(running, "voided-writer")
        producer.begin_transaction()
        for i in range(5):
            producer.produce("voided", f"void-{i}".encode(), partition=0)
        assert producer.flush(30) == 0  # in the log before the abort, not purged by it
        producer.abort_transaction(30)
        plain = Producer({"bootstrap.servers": running.bootstrap})
        plain.produce("beside", b"kept", partition=0)
        assert plain.flush(30) == 0
    finally:
        assert running.stop() == 0

    running = compacted(data)  # on main, the compactor's process died on the empty file
    try:
        assert read_all(running, "voided", "read_committed", partitions=1) == []
        assert read_all(running, "voided", "read_uncommitted", partitions=1) == []
        plain = Producer({"bootstrap.servers": running.bootstrap})
        plain.produce("voided", b"after", partition=0)
        assert plain.flush(30) == 0
        deadline = time.monotonic() + 120
        while not all(row["lag_records"] == 0 for row in tables(running)):
            assert time.monotonic() < deadline, "compaction did not catch up"
            time.sleep(0.5)
        assert read_all(running, "voided", "read_committed", partitions=1) == [b"after"]
        for isolation in ("read_committed", "read_uncommitted"):
            # Kafka's Java consumer moves past the batch of no records too.
            printed = KafkaTools(running.bootstrap).run(
                CONSOLE_CONSUMER,
                "--topic", "voided",
                "--from-beginning",
                "--isolation-level", isolation,
                "--max-messages", "1",
                "--timeout-ms", "30000",
                "--property", "print.offset=true",
            )  # fmt: skip
            assert rows(printed) == [["Offset:6", "after"]], printed
        in_tables = {(row["topic"], row["format"]): row for row in tables(running)}
    finally:
        assert running.stop() == 0
    for topic, expected in (("voided", [b"after"]), ("beside", [b"kept"])):
        delta, iceberg = in_tables[(topic, "delta")], in_tables[(topic, "iceberg")]
        assert delta["commit"] == iceberg["commit"]  # the formats at the same commit
        assert delta["files"] == iceberg["files"] == 1
        values = duckdb_rows(f"delta_scan('{delta['location']}')")
        assert [row[3] for row in values] == expected
        assert [row[1] for row in values] == ([6] if topic == "voided" else [0])
