"""A pipeline of consumer groups on three brokers: group i consumes topic i and produces each
record to topic i + 1, while members join and leave. Every record must reach the last topic
(at least once; more than once only where a member's commit did not go through), and when
one does not, the failure says what was stuck (see tests/support/group_chain.py).

`python -m tests.chaos.group_chain` runs the long version: many runs, mixed protocols and
assignors, broker SIGKILLs, CPU load.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.group_chain import (
    Chain,
    Sink,
    Source,
    await_records,
    churn,
    hop_report,
    stall_report,
    unexplained_copies,
)
from tests.support.group_members import BROKER_ENV
from tests.support.topics import create_topic

GROUPS = 3
PARTITIONS = 4
RECORDS = 1200
SOURCE_SECONDS = 8.0
CHURN_EVERY_S = 1.2
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningIcefloe]:
    """Three brokers; each test has topics and groups of its own."""
    running = start_icefloe(tmp_path_factory.mktemp("chain") / "data", brokers=3, env=BROKER_ENV)
    yield running
    running.stop()


@pytest.mark.slow
@pytest.mark.parametrize(
    "flavour", ["classic-range", "classic-cooperative-sticky", "consumer-uniform"]
)
def test_every_record_flows_through_a_chain_of_groups_while_members_come_and_go(
    cluster: RunningIcefloe, flavour: str
) -> None:
    topics = [f"{flavour}-{i}" for i in range(GROUPS + 1)]
    for topic in topics:
        create_topic(cluster, topic, PARTITIONS)
    chain = Chain(
        bootstrap=[cluster.broker_address(i) for i in range(cluster.brokers)],
        data_dir=cluster.data_dir,
        topics=topics,
        groups=[f"{flavour}-g{i}" for i in range(GROUPS)],
        flavours=[flavour] * GROUPS,
        partitions=PARTITIONS,
        auto_commit=[False, True, False],  # the middle group commits in the background
    )
    sink = Sink(cluster.bootstrap, topics[-1], PARTITIONS).start()
    for index in range(GROUPS):
        chain.add_member(index)
        chain.add_member(index)
    source = Source(cluster.bootstrap, topics[0], RECORDS, SOURCE_SECONDS).start()
    changes: list[str] = []

    def come_and_go(elapsed: float) -> bool:
        # Each group gains a member, then loses its oldest, while the records flow.
        if len(changes) < 2 * GROUPS and elapsed >= CHURN_EVERY_S * (len(changes) + 1):
            changes.append(churn(chain, len(changes)))
        return len(changes) < 2 * GROUPS

    try:
        outcome = await_records(sink, RECORDS, DEADLINE_S, come_and_go)
        source.join(10)
        report = stall_report(chain, outcome) if outcome.missing else ""
    finally:
        chain.stop()
        sink.stop()
    assert not chain.failures(), chain.failures()
    assert len(changes) == 2 * GROUPS, f"only {changes} happened"
    assert not outcome.missing, report
    print(f"{flavour}: {outcome.duplicates} duplicates, all in {outcome.seconds:.1f} s")
    twice = unexplained_copies(chain, sink)
    assert not twice, (
        f"{len(twice)} records arrived more often than uncommitted processing explains:\n"
        + hop_report(chain, twice)
    )
