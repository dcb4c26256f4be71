"""What read_committed and read_uncommitted consumers read while transactions commit and abort,
plain producers write, and compaction and log compaction run, on a ``compact,delete`` topic
and a plain one: a seeded random driver checks every read against a model of what Kafka
lets a consumer see (:mod:`tests.support.read_chaos`, :mod:`tests.support.read_model`),
in-process (the driver runs compaction, cleaning and merges between and beside the clients'
actions) and against ``icefloe serve`` (its compactor runs on its own, quickly); then the
cases it found, each reduced to its few steps.

The suite runs a short version. The long one, by hand::

    ICEFLOE_READ_CHAOS_EPISODES=50 ICEFLOE_READ_CHAOS_ROUNDS=10 \\
        uv run --no-sync pytest tests/integration/test_reads_under_compaction.py -n 0 \\
        -k chaos --timeout 0

and ``ICEFLOE_READ_CHAOS_SEED`` picks the first seed (each in-process episode and each serve
round has a seed of its own; a failure names it, with the actions that led to it).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.read_chaos import (
    InProcessIcefloe,
    ReadChaos,
    Reader,
    ServedIcefloe,
    read_confluent,
    read_kafka_python,
)
from tests.support.read_model import READ_COMMITTED, READ_UNCOMMITTED

EPISODES = int(os.environ.get("ICEFLOE_READ_CHAOS_EPISODES", "1"))
"""In-process episodes per setting (the suite's 1 takes about 10 s each)."""
ROUNDS = int(os.environ.get("ICEFLOE_READ_CHAOS_ROUNDS", "1"))
"""Rounds against ``icefloe serve``, each a server of its own."""
STEPS = int(os.environ.get("ICEFLOE_READ_CHAOS_STEPS", "40"))
SEED = int(os.environ.get("ICEFLOE_READ_CHAOS_SEED", "1"))
READERS: list[Reader] = [read_confluent, read_kafka_python]


@pytest.fixture
def in_process(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[InProcessIcefloe]:
    target = InProcessIcefloe(tmp_path / "data", replaced_wal_reads_s=request.param)
    try:
        yield target
    finally:
        target.close()


KEPT = pytest.mark.parametrize(
    "in_process",
    [0, 300],
    ids=["reads-from-data-files", "reads-from-kept-wal-entries"],
    indirect=True,
)


@KEPT
def test_chaos_in_process(in_process: InProcessIcefloe) -> None:
    """Episodes of random actions, compaction run by the driver; every read as the model says."""
    for episode in range(EPISODES):
        chaos = ReadChaos(in_process, SEED + episode, run=f"e{episode}")
        try:
            chaos.run_episode(STEPS)
        finally:
            chaos.close()
        # The check ran (each topic is read to its end at least), on cleaned data files.
        assert chaos.reads >= 4
        assert chaos.did.get("clean", 0) > 0


def test_chaos_against_serve(tmp_path: Path) -> None:
    """Rounds of random actions against ``icefloe serve`` compacting and cleaning every fifth
    of a second; every other round reads compacted ranges from the data files at once."""
    for round_ in range(ROUNDS):
        env = {"ICEFLOE_STORAGE__REPLACED_WAL_READS_S": "0"} if round_ % 2 else {}
        target = ServedIcefloe.start(tmp_path / f"data-{round_}", env)
        try:
            chaos = ReadChaos(target, SEED + 10_000 + round_, run=f"r{round_}")
            try:
                chaos.run_episode(STEPS)
            finally:
                chaos.close()
        finally:
            assert target.running.stop() == 0
        assert chaos.reads >= 4  # each topic at least, after a cleaning


# --- the cases the chaos found ------------------------------------------------------------


def transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(30)
    return producer


def write_in_transaction(producer: Producer, topic: str, key: bytes, value: bytes) -> None:
    producer.begin_transaction()
    producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(30) == 0  # in the log before the transaction ends


def compact_and_clean(target: InProcessIcefloe) -> None:
    assert target.start_compaction("compact").result(120) is not None
    target.start_compaction("clean").result(120)


@pytest.mark.parametrize(
    ("in_process", "policy"),
    [(300, "compact,delete"), (0, "delete")],
    ids=["cleaned", "read-from-the-data-file"],
    indirect=["in_process"],
)
def test_a_transaction_aborted_in_a_data_file_hides_none_of_its_producers_later_records(
    in_process: InProcessIcefloe, policy: str
) -> None:
    """A data file holds neither an aborted transaction's records nor its marker, so a fetch
    that reads the file on into the WAL must not list the transaction as aborted: a consumer
    would skip the same producer's transactional records from the transaction's first offset
    on, until an abort marker that never comes, and lose a committed record that
    read_uncommitted sees. The file is read once log compaction cleaned it, or at once by a
    broker that did not cache the WAL entries it replaced."""
    in_process.create_topic("ledger", {"cleanup.policy": policy})
    producer = transactional(in_process.bootstrap, "ledger-writer")
    write_in_transaction(producer, "ledger", b"a", b"aborted")  # offset 0, its marker at 1
    producer.abort_transaction(30)
    compact_and_clean(in_process)
    write_in_transaction(producer, "ledger", b"b", b"committed")  # offset 2, in the WAL
    producer.commit_transaction(30)
    producer.close()
    for read, isolation in itertools.product(READERS, (READ_COMMITTED, READ_UNCOMMITTED)):
        seen, reached, _ = read(in_process.bootstrap, "ledger", isolation, 0, 4, 1 << 20)
        assert (seen, reached) == ([(2, b"b", b"committed")], 4), (read.__name__, isolation)


@pytest.mark.parametrize("in_process", [0], ids=["reads-from-data-files"], indirect=True)
def test_a_read_past_a_data_files_last_record_reaches_the_files_end(
    in_process: InProcessIcefloe,
) -> None:
    """The offsets of a data file after its last record (here an aborted transaction, which
    compaction leaves out) are read as one empty batch that ends at the file's end, so that a
    consumer's position moves past them when nothing is read after them: the log end, or an
    open transaction for read_committed. A read that returned nothing would leave the
    consumer where it is for as long as the transaction stays open."""
    in_process.create_topic("ledger", {})
    plain = Producer({"bootstrap.servers": in_process.bootstrap})
    plain.produce("ledger", key=b"k", value=b"plain", partition=0)  # offset 0
    assert plain.flush(30) == 0
    plain.close()
    first = transactional(in_process.bootstrap, "first")
    write_in_transaction(first, "ledger", b"a", b"aborted")  # offset 1, its marker at 2
    first.abort_transaction(30)
    first.close()
    compact_and_clean(in_process)  # a data file of [0, 3) holding offset 0 only
    second = transactional(in_process.bootstrap, "second")
    write_in_transaction(second, "ledger", b"o", b"open")  # offset 3: the last stable offset
    try:
        for read, start in itertools.product(READERS, (0, 1, 2)):
            seen, reached, _ = read(in_process.bootstrap, "ledger", READ_COMMITTED, start, 3, 300)
            wanted = [(0, b"k", b"plain")] if start == 0 else []
            assert (seen, reached) == (wanted, 3), (read.__name__, start)
        for read in READERS:
            seen, reached, _ = read(in_process.bootstrap, "ledger", READ_UNCOMMITTED, 2, 4, 300)
            assert (seen, reached) == ([(3, b"o", b"open")], 4), read.__name__
    finally:
        second.abort_transaction(30)
        second.close()


def test_a_range_of_an_aborted_transaction_alone_reaches_the_tables(tmp_path: Path) -> None:
    """Compaction of a range that holds only an aborted transaction and its marker (a data
    file of no rows) commits, with both table formats on."""
    target = InProcessIcefloe(tmp_path / "data", replaced_wal_reads_s=0, tables=True)
    try:
        target.create_topic("ledger", {})
        producer = transactional(target.bootstrap, "ledger-writer")
        write_in_transaction(producer, "ledger", b"a", b"aborted")
        producer.abort_transaction(30)
        producer.close()
        assert target.start_compaction("compact").result(120) is not None
    finally:
        target.close()
