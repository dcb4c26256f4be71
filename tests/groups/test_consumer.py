"""KIP-848 transitions (ConsumerGroupHeartbeat), one behaviour per test (pure: no I/O)."""

from __future__ import annotations

import uuid

from kio.schema.errors import ErrorCode

from icefloe.config.groups import GroupOptions
from icefloe.groups import consumer
from icefloe.groups.consumer import HeartbeatRequest, HeartbeatResult
from icefloe.groups.model import Assignment, ClassicGroup, ConsumerGroup, MemberState, TopicInfo

T = uuid.UUID(int=7)
CATALOG = {"t": TopicInfo(T, 6), "other": TopicInfo(uuid.UUID(int=8), 2)}
OPTIONS = GroupOptions(consumer_session_timeout_ms=10_000)
T0 = 1_000_000


def beat(
    group: ConsumerGroup | None, request: HeartbeatRequest, now: int = T0
) -> tuple[ConsumerGroup, HeartbeatResult]:
    new, result = consumer.heartbeat(group, "g", request, CATALOG, now, OPTIONS)
    return (new if new is not None else group or ConsumerGroup("g")), result


def join(member: str, topics: tuple[str, ...] = ("t",), **kw: object) -> HeartbeatRequest:
    return HeartbeatRequest(
        member_id=member,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=topics,
        owned={},
        **kw,  # type: ignore[arg-type]
    )


def poll(member: str, epoch: int, owned: Assignment | None = None) -> HeartbeatRequest:
    return HeartbeatRequest(member_id=member, member_epoch=epoch, owned=owned)


def parts(result: HeartbeatResult) -> frozenset[int]:
    assert result.assignment is not None
    return result.assignment.get(T, frozenset())


def test_first_member_gets_every_partition_at_epoch_one() -> None:
    g, result = beat(None, join("a"))
    assert (result.error, result.member_epoch) == (ErrorCode.none, 1)
    assert parts(result) == frozenset(range(6))
    assert g.state_name == "Stable"


def test_second_member_waits_until_the_first_revokes() -> None:
    g, _ = beat(None, join("a"))
    g, b = beat(g, join("b"))
    assert b.member_epoch == 2
    assert parts(b) == frozenset()  # everything is still a's
    g, a2 = beat(g, poll("a", 1))
    assert a2.member_epoch == 1  # a must revoke before moving on
    kept = parts(a2)
    assert len(kept) == 3
    g, a3 = beat(g, poll("a", 1, owned={T: kept}))
    assert a3.member_epoch == 2
    g, b2 = beat(g, poll("b", 2))
    assert parts(b2) == frozenset(range(6)) - kept
    assert g.state_name == "Stable"


def test_member_in_revocation_is_unrevoked_partitions() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, join("b"))
    g, _ = beat(g, poll("a", 1))
    member = g.member("a")
    assert member is not None
    assert member.state is MemberState.UNREVOKED_PARTITIONS


def test_heartbeat_with_a_future_epoch_is_fenced() -> None:
    g, _ = beat(None, join("a"))
    _, result = beat(g, poll("a", 5))
    assert result.error is ErrorCode.fenced_member_epoch


def test_heartbeat_with_the_previous_epoch_and_owned_subset_is_accepted() -> None:
    # The response that moved a member to epoch 2 may be lost: it heartbeats again with 1.
    g, _ = beat(None, join("a"))
    g, _ = beat(g, join("b"))
    g, revoking = beat(g, poll("a", 1))
    kept = {T: parts(revoking)}
    g, moved = beat(g, poll("a", 1, owned=kept))
    assert moved.member_epoch == 2
    _, late = beat(g, poll("a", 1, owned=kept))
    assert (late.error, late.member_epoch) == (ErrorCode.none, 2)


def test_unknown_member_is_rejected() -> None:
    g, _ = beat(None, join("a"))
    _, result = beat(g, poll("zz", 1))
    assert result.error is ErrorCode.unknown_member_id


def test_leaving_member_frees_its_partitions_for_the_others() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, join("b"))
    g, left = beat(g, HeartbeatRequest(member_id="a", member_epoch=consumer.LEAVE_EPOCH))
    assert left.member_epoch == consumer.LEAVE_EPOCH
    g, b = beat(g, poll("b", 2))
    assert parts(b) == frozenset(range(6))


def test_silent_member_is_fenced_after_the_session_timeout() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, join("b"))
    assert consumer.advance(g, {"a": T0 + 5_000}, CATALOG, T0 + 9_999, OPTIONS) is None
    after = consumer.advance(g, {"a": T0 + 5_000}, CATALOG, T0 + 10_000, OPTIONS)
    assert after is not None
    assert [m.member_id for m in after.members] == ["a"]
    assert after.group_epoch == g.group_epoch + 1


def test_member_that_does_not_revoke_in_time_is_fenced() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, join("b"))
    g, _ = beat(g, poll("a", 1))
    deadline = T0 + 30_000
    alive = {"a": deadline, "b": deadline}
    after = consumer.advance(g, alive, CATALOG, deadline, OPTIONS)
    assert after is not None
    assert [m.member_id for m in after.members] == ["b"]


def test_unknown_server_assignor_is_refused() -> None:
    _, result = beat(None, join("a", server_assignor="sticky"))
    assert result.error is ErrorCode.unsupported_assignor


def test_range_assignor_can_be_chosen() -> None:
    g, _ = beat(None, join("a", server_assignor="range"))
    assert g.assignor == "range"


def test_regex_subscription_matches_topic_names() -> None:
    request = HeartbeatRequest(
        member_id="a",
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_regex="oth.*",
        owned={},
    )
    _, result = beat(None, request)
    assert result.assignment is not None
    assert set(result.assignment) == {CATALOG["other"].topic_id}


def test_a_full_heartbeat_of_a_regex_subscriber_gets_its_assignment_again() -> None:
    """After an error a member sends everything (its regex, not topic names, for a regex
    subscription): it may have missed the response that carried its assignment."""
    subscribed = HeartbeatRequest(
        member_id="a",
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_regex="oth.*",
        owned={},
    )
    g, _ = beat(None, subscribed)
    full = HeartbeatRequest(
        member_id="a",
        member_epoch=1,
        rebalance_timeout_ms=30_000,
        subscribed_topic_regex="oth.*",
        owned={},
    )
    _, result = beat(g, full)
    assert result.assignment == {CATALOG["other"].topic_id: frozenset({0, 1})}


def test_unchanged_heartbeat_writes_nothing() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, poll("a", 1, owned={T: frozenset(range(6))}))  # a has its assignment
    new, result = consumer.heartbeat(g, "g", poll("a", 1), CATALOG, T0 + 100, OPTIONS)
    assert new is None
    assert result.assignment is None  # an assignment the member has is not resent


def test_a_revocation_whose_answer_was_lost_is_told_again() -> None:
    """librdkafka waits a heartbeat interval for an answer; one slower is lost to it though
    the coordinator's decision stands, and its next heartbeat (same epoch, nothing owned)
    looked like nothing happened: the member kept the partition it was to give up, and the
    member waiting for it waited until the revocation deadline."""
    g, _ = beat(None, join("a"))
    g, _ = beat(g, poll("a", 1, owned={T: frozenset(range(6))}))
    g, _ = beat(g, join("b"))
    g, told = beat(g, poll("a", 1))  # this answer never reaches a
    kept = parts(told)
    assert len(kept) == 3
    g, again = beat(g, poll("a", 1))
    assert again.assignment is not None, "a is never told to give up its partitions"
    assert parts(again) == kept
    g, done = beat(g, poll("a", 1, owned={T: kept}))  # a revokes and says so
    assert done.member_epoch == 2
    _, quiet = beat(g, poll("a", 2))
    assert quiet.assignment is None


def test_partitions_released_to_a_member_whose_answer_was_lost_are_told_again() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, poll("a", 1, owned={T: frozenset(range(6))}))
    g, _ = beat(g, join("b"))
    g, told = beat(g, poll("a", 1))
    g, _ = beat(g, poll("a", 1, owned={T: parts(told)}))
    g, released = beat(g, poll("b", 2))  # this answer never reaches b
    freed = frozenset(range(6)) - parts(told)
    assert parts(released) == freed
    _, again = beat(g, poll("b", 2))
    assert again.assignment is not None, "b never learns of the partitions a released"
    assert parts(again) == freed


def test_non_empty_classic_group_refuses_consumer_members() -> None:
    from icefloe.groups.model import ClassicMember

    member = ClassicMember("c", None, "", "", 10_000, 10_000, "consumer", (("range", b""),))
    classic_group = ClassicGroup("g", members=(member,))
    _, result = consumer.heartbeat(classic_group, "g", join("a"), CATALOG, T0, OPTIONS)
    assert result.error is ErrorCode.inconsistent_group_protocol


def test_commit_checks_the_member_epoch() -> None:
    g, _ = beat(None, join("a"))
    assert consumer.commit_error(g, "a", 1) is ErrorCode.none
    assert consumer.commit_error(g, "a", 0) is ErrorCode.stale_member_epoch
    assert consumer.commit_error(g, "a", 2) is ErrorCode.stale_member_epoch  # as Kafka
    assert consumer.commit_error(g, "zz", 1) is ErrorCode.unknown_member_id


def test_transactional_commits_are_fenced_by_the_member_epoch() -> None:
    g, _ = beat(None, join("a"))
    g, _ = beat(g, join("b"))
    epoch = g.member("a").member_epoch  # type: ignore[union-attr]
    assert consumer.txn_commit_error(g, "a", None, epoch) is ErrorCode.none
    # Either side of the member's epoch is ILLEGAL_GENERATION, the error producers know.
    assert consumer.txn_commit_error(g, "a", None, epoch - 1) is ErrorCode.illegal_generation
    assert consumer.txn_commit_error(g, "a", None, epoch + 1) is ErrorCode.illegal_generation
    assert consumer.txn_commit_error(g, "zz", None, epoch) is ErrorCode.unknown_member_id
    # TxnOffsetCommit before v3 names no member; an empty group takes a commit without epoch.
    assert consumer.txn_commit_error(g, "", None, -1) is ErrorCode.none
    assert consumer.txn_commit_error(g, "", None, -2) is ErrorCode.unknown_member_id
    assert consumer.txn_commit_error(ConsumerGroup("g"), "", None, -1) is ErrorCode.none


def test_a_static_member_away_commits_nothing_transactionally() -> None:
    g, _ = beat(None, join("a", instance_id="i1"))
    epoch = g.member("a").member_epoch  # type: ignore[union-attr]
    g, _ = beat(g, HeartbeatRequest(member_id="a", member_epoch=consumer.STATIC_LEAVE_EPOCH))
    assert consumer.txn_commit_error(g, "a", "i1", epoch) is ErrorCode.illegal_generation


def test_static_member_that_leaves_temporarily_keeps_its_partitions() -> None:
    g, _ = beat(None, join("a", instance_id="i1"))
    away = HeartbeatRequest(member_id="a", member_epoch=consumer.STATIC_LEAVE_EPOCH)
    g, _ = beat(g, away)
    g, back = beat(g, join("a2", instance_id="i1"))
    assert back.error is ErrorCode.none
    assert parts(back) == frozenset(range(6))
    assert [m.member_id for m in g.members] == ["a2"]


def test_second_live_member_with_the_same_instance_id_is_refused() -> None:
    g, _ = beat(None, join("a", instance_id="i1"))
    _, result = beat(g, join("a2", instance_id="i1"))
    assert result.error is ErrorCode.unreleased_instance_id
