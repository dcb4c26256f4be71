"""The end-to-end proof of exactly-once with consumer groups (KIP-447): a transactional
consume-transform-produce pipeline of several confluent-kafka members of one group, both group
protocols, turns 3,000 inputs into exactly 3,000 outputs read with read_committed, each input
once, while members join and leave, one is killed mid-transaction and two are paused past their
session (one before sending its offsets, whose commit the group must refuse, one after, whose
partitions' new owner must wait for its transaction); then the same while brokers of a
three-broker `icefloe serve` are killed.

Kafka's Java client too: members of tests/integration/java/EosPipeline.java stalled past their
poll interval, one before sending its offsets and one after.

The long version, minutes of random member faults while brokers are killed, is run by hand:
``python -m tests.chaos.eos_pipeline``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_transactions import create
from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe
from tests.support.eos_diagnosis import diagnose
from tests.support.eos_pipeline import (
    InputFeed,
    PipelineWorker,
    read_committed,
    tally,
    transaction_state,
    unstable_partitions,
    wait_until,
    wait_until_consumed,
)
from tests.support.group_members import BROKER_ENV
from tests.support.kafka_jvm import compile_java

INPUTS = 3000
IN_PARTITIONS = 6
OUT_PARTITIONS = 3
FEED_SECONDS = 10
PAUSED_TXN_TIMEOUT_MS = 120_000
REFUSED = {"UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION"}
"""What the group answers a member that was paused past its session (classic: it was removed;
KIP-848: likewise, or at another epoch if it came back first)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    running = start_icefloe(
        tmp_path_factory.mktemp("eos-pipeline") / "data", brokers=2, env=dict(BROKER_ENV)
    )
    try:
        yield running
    finally:
        running.stop()


class Pipeline:
    """The members of one test's pipeline."""

    def __init__(self, cluster: RunningIcefloe, protocol: str, name: str, log_dir: Path) -> None:
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap
        self.protocol = protocol
        self.group = name
        self.topics = (f"{name}-in", f"{name}-out")
        self.log_dir = log_dir
        self.workers: list[PipelineWorker] = []
        create(cluster, self.topics[0], IN_PARTITIONS)
        create(cluster, self.topics[1], OUT_PARTITIONS)

    def start(
        self,
        transactional_id: str,
        pause_at: str | None = None,
        transaction_timeout_ms: int | None = None,
    ) -> PipelineWorker:
        worker = PipelineWorker(
            self.bootstrap,
            self.group,
            transactional_id,
            self.protocol,
            self.topics,
            self.log_dir,
            pause_at,
            transaction_timeout_ms,
        )
        self.workers.append(worker.start())
        return worker

    def feed(self) -> InputFeed:
        feed = InputFeed(self.bootstrap, self.topics[0], INPUTS, IN_PARTITIONS, FEED_SECONDS)
        feed.start()
        return feed

    def wait_until_assigned(self) -> None:
        wait_until(
            lambda: all(w.owned() for w in self.workers),
            "every member has partitions",
            120,
        )

    def owned_by_others(self, *left_out: PipelineWorker) -> set[int]:
        return {p for w in self.workers if w not in left_out and w.alive() for p in w.owned()}

    def finish(self, feed: InputFeed) -> None:
        feed.join(120)
        assert feed.error is None, feed.error
        wait_until_consumed(self.bootstrap, self.group, self.topics[0], IN_PARTITIONS)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Stop every member at the end; each must have ended well (exit 0), but for those the
        test killed and those whose client's close outlasted their work (it waits on the
        group coordinator, which has nothing left to do with exactly-once). A failure inside is
        reported as it is, not as members that ended badly because of it."""
        try:
            yield
        except BaseException:
            for worker in self.workers:
                worker.stop()
            raise
        for worker in self.workers:
            worker.stop()
        failed = [
            w.describe()
            for w in self.workers
            if not (w.killed or w.hung_closing) and w.exit_code() != 0
        ]
        assert not failed, failed

    def check_exactly_once(self) -> None:
        values = read_committed(self.bootstrap, self.topics[1], OUT_PARTITIONS)
        counted = tally(values, INPUTS)
        if not (counted.exactly_once and counted.outputs == INPUTS):
            why = diagnose(
                self.cluster.data_dir, self.topics, self.group, INPUTS, values, self.workers
            )
            pytest.fail(f"{counted}\n{why}")


def kill_mid_transaction(pipeline: Pipeline, doomed: PipelineWorker) -> PipelineWorker:
    """``doomed`` paused itself with its offsets sent: kill it there, and start the instance
    that takes its transactional id over (and aborts what it left)."""
    paused = doomed.wait_for("paused")
    assert transaction_state(pipeline.bootstrap, doomed.transactional_id) == "Ongoing"
    assert set(paused["partitions"]) <= unstable_partitions(
        pipeline.bootstrap, pipeline.group, pipeline.topics[0], IN_PARTITIONS
    )
    doomed.kill()
    return pipeline.start(doomed.transactional_id)


def outlast_sessions(pipeline: Pipeline, late: PipelineWorker, zombie: PipelineWorker) -> None:
    """``late`` paused after sending its offsets, ``zombie`` before. Once the group has given
    ``late``'s partitions to others, its pending offsets keep the new owners waiting: woken, it
    commits. Once ``zombie``'s have moved too, woken, its offsets are refused and it aborts.

    One after the other: a member waiting for ``late``'s offsets cannot take ``zombie``'s
    partitions meanwhile (it waits inside its assignment callback), so waiting for both moves
    before waking either would wait for ``late``'s transaction to time out."""
    late_paused, zombie_paused = late.wait_for("paused"), zombie.wait_for("paused")
    late_parts, zombie_parts = set(late_paused["partitions"]), set(zombie_paused["partitions"])
    assert late_parts <= unstable_partitions(
        pipeline.bootstrap, pipeline.group, pipeline.topics[0], IN_PARTITIONS
    )
    wait_until(
        lambda: late_parts <= pipeline.owned_by_others(late, zombie),
        "the late member's partitions moved to others",
        120,
    )
    # Still pending: the new owners wait for the transaction of the member they replaced.
    assert late_parts <= unstable_partitions(
        pipeline.bootstrap, pipeline.group, pipeline.topics[0], IN_PARTITIONS
    )
    late.signal(signal.SIGCONT)
    late.wait_for("committed", txn=late_paused["txn"])  # its transaction was still its own
    wait_until(
        lambda: zombie_parts <= pipeline.owned_by_others(zombie),
        "the zombie's partitions moved to others",
        120,
    )
    zombie.signal(signal.SIGCONT)
    refused = zombie.wait_for("aborted", txn=zombie_paused["txn"])
    assert refused["error"] in REFUSED, refused


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_members_joining_leaving_pausing_and_dying_leave_each_input_output_once(
    cluster: RunningIcefloe, protocol: str, tmp_path: Path
) -> None:
    pipeline = Pipeline(cluster, protocol, f"eos-{protocol}", tmp_path)
    # Their transactions must outlast their pauses and the group's moving of their partitions,
    # however slow the machine: their timing out would be another test.
    late = pipeline.start("late", pause_at="sent:4", transaction_timeout_ms=PAUSED_TXN_TIMEOUT_MS)
    zombie = pipeline.start(
        "zombie", pause_at="produced:4", transaction_timeout_ms=PAUSED_TXN_TIMEOUT_MS
    )
    doomed = pipeline.start("doomed", pause_at="sent:3")
    with pipeline.running():
        pipeline.wait_until_assigned()  # each has partitions before the inputs come
        feed = pipeline.feed()
        kill_mid_transaction(pipeline, doomed)
        joiner = pipeline.start("joiner")
        outlast_sessions(pipeline, late, zombie)
        joiner.wait_for("committed")
        assert joiner.stop() == 0, joiner.describe()  # and a member leaves
        pipeline.finish(feed)
    pipeline.check_exactly_once()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_pipeline_stays_exactly_once_while_brokers_are_killed(
    protocol: str, tmp_path: Path
) -> None:
    # A killed broker's producer leases pass to another after twice their length: 6 s rather
    # than the default 20 keeps the test short and the takeover the same.
    env = dict(BROKER_ENV) | {"ICEFLOE_STORAGE__PRODUCER_LEASE_S": "3"}
    cluster = start_icefloe(tmp_path / "data", brokers=3, env=env)
    try:
        pipeline = Pipeline(cluster, protocol, f"eos-brokers-die-{protocol}", tmp_path)
        for name in ("one", "two", "three"):
            pipeline.start(name)
        killed = []
        with pipeline.running():
            pipeline.wait_until_assigned()
            feed = pipeline.feed()
            for delay, victim in ((4, 0), (8, 1), (8, 2)):  # while the inputs arrive, and after
                time.sleep(delay)
                brokers = broker_pids(cluster)
                assert len(brokers) == 3, brokers  # serve restarted the one killed before
                os.kill(brokers[victim], signal.SIGKILL)
                killed.append(brokers[victim])
            pipeline.start("joiner")
            pipeline.finish(feed)
        assert not set(killed) & set(broker_pids(cluster))  # the kills took
        pipeline.check_exactly_once()
    finally:
        cluster.stop()


JAVA_SOURCE = Path(__file__).parent / "java" / "EosPipeline.java"
JAVA_INPUTS = 600


class JavaMember:
    """An EosPipeline JVM and the lines it printed."""

    def __init__(self, command: list[str], log: Path) -> None:
        with log.open("w") as errors:
            self.process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=errors, text=True
            )
        self.log = log
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.strip())

    def wait_for(self, line: str, timeout: float = 120) -> None:
        """Until it printed ``line`` (or a line starting so, for a ``line`` ending in a space)."""

        def printed() -> bool:
            return any(x == line or (line.endswith(" ") and x.startswith(line)) for x in self.lines)

        wait_until(
            lambda: printed() or self.process.poll() is not None,
            f"EosPipeline printed {line!r}",
            timeout,
        )
        assert printed(), f"{self.lines[-5:]} {self.log.read_text()[-2000:]}"

    def transaction_committed(self, number: int) -> bool:
        return any(x.startswith("committed ") and x.endswith(f" {number}") for x in self.lines)

    def stop(self) -> None:
        self.process.kill()  # everything is committed: nothing is left to finish
        self.process.wait(30)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_java_members_stalled_past_their_poll_interval_leave_each_input_output_once(
    cluster: RunningIcefloe, protocol: str, tmp_path: Path
) -> None:
    """One member stalls after sending its offsets, one before, past max.poll.interval.ms: the
    consumer leaves the group and a third member takes their partitions. The first commits
    when it wakes, and the new owner waits for that; the second's offsets are refused
    (CommitFailedException), and it aborts."""
    run = compile_java(JAVA_SOURCE, tmp_path)
    group = f"java-{protocol}"
    topics = (f"{group}-in", f"{group}-out")
    create(cluster, topics[0], 4)
    create(cluster, topics[1], 2)

    def member(name: str, *stall: str) -> JavaMember:
        args = [cluster.bootstrap, f"{group}-{name}", protocol, group, *topics, "30000", *stall]
        return JavaMember([*run, *args], tmp_path / f"{name}.log")

    steady = member("steady")
    late = member("late", "after-offsets:3:7000")
    zombie = member("zombie", "before-offsets:3:7000")
    members = [steady, late, zombie]
    try:
        for m in members:  # each has partitions before the inputs come
            m.wait_for("assigned ")
        feed = InputFeed(cluster.bootstrap, topics[0], JAVA_INPUTS, 4, FEED_SECONDS)
        feed.start()
        late.wait_for("stalled after-offsets 3")
        zombie.wait_for("stalled before-offsets 3")
        late.wait_for("resumed 3")
        wait_until(lambda: late.transaction_committed(3), "the late member committed", 120)
        zombie.wait_for("aborted 3 CommitFailedException")
        feed.join(120)
        assert feed.error is None, feed.error
        wait_until_consumed(cluster.bootstrap, group, topics[0], 4)
    finally:
        for m in members:
            m.stop()
    assert any(x.startswith("committed ") for x in steady.lines)
    counted = tally(read_committed(cluster.bootstrap, topics[1], 2), JAVA_INPUTS, prefix="")
    assert counted.exactly_once, counted
