"""The classic group protocol's transitions, one behaviour per test (pure: no I/O)."""

from __future__ import annotations

from dataclasses import replace

from kio.schema.errors import ErrorCode

from icefloe.config.groups import GroupOptions
from icefloe.groups import classic
from icefloe.groups.model import ClassicGroup, ClassicState

OPTIONS = GroupOptions(min_session_timeout_ms=100, initial_rebalance_delay_ms=0)
T0 = 1_000_000


def request(
    member_id: str = "", instance: str | None = None, **changes: object
) -> classic.JoinRequest:
    base = classic.JoinRequest(
        member_id=member_id,
        instance_id=instance,
        client_id="app",
        client_host="/127.0.0.1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=30_000,
        protocol_type="consumer",
        protocols=(("range", b"r"), ("roundrobin", b"rr")),
        require_known_member_id=False,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def join(
    group: ClassicGroup | None, req: classic.JoinRequest, now: int = T0, new_id: str = "m"
) -> tuple[ClassicGroup, classic.JoinOutcome]:
    new, outcome = classic.join(group, "g", req, now, OPTIONS, new_id)
    return (new if new is not None else group or ClassicGroup("g")), outcome


def stable_pair() -> ClassicGroup:
    """Members a (leader) and b, generation 1, assigned."""
    g, _ = join(None, request(), new_id="a")
    g, _ = join(g, request(), new_id="b")  # a has not rejoined: still preparing
    g, _ = join(g, request("a"))
    assert g.state is ClassicState.COMPLETING_REBALANCE
    g2, _ = classic.sync(g, "a", None, g.generation, None, None, {"a": b"A", "b": b"B"}, T0)
    assert g2 is not None
    return g2


def test_first_member_completes_a_join_alone_and_leads() -> None:
    g, outcome = join(None, request(), new_id="a")
    assert outcome == classic.JoinWait("a", after=0)
    assert g.state is ClassicState.COMPLETING_REBALANCE
    assert (g.generation, g.leader, g.protocol_name) == (1, "a", "range")


def test_new_dynamic_member_first_gets_member_id_required() -> None:
    g, outcome = join(None, request(require_known_member_id=True), new_id="a-1")
    assert outcome == classic.JoinError(ErrorCode.member_id_required, "a-1")
    assert not g.members
    g, outcome = join(g, request("a-1", require_known_member_id=True))
    assert outcome == classic.JoinWait("a-1", after=0)


def test_unknown_member_id_is_rejected() -> None:
    _, outcome = join(stable_pair(), request("nobody"))
    assert outcome == classic.JoinError(ErrorCode.unknown_member_id)


def test_join_waits_until_every_member_has_rejoined() -> None:
    before = stable_pair()
    g, outcome = join(before, request(), new_id="c")
    assert g.state is ClassicState.PREPARING_REBALANCE
    assert isinstance(outcome, classic.JoinWait)
    assert classic.join_result(g, "c", outcome.after) is None
    g, _ = join(g, request("a"))
    g, _ = join(g, request("b"))
    assert g.state is ClassicState.COMPLETING_REBALANCE
    assert g.generation == before.generation + 1
    assert classic.join_result(g, "c", outcome.after) is ErrorCode.none


def test_initial_delay_holds_the_first_join_of_an_empty_group() -> None:
    options = OPTIONS.model_copy(
        update={"initial_rebalance_delay_ms": 3000, "initial_rebalance_quiet_ms": 3000}
    )
    g, _ = classic.join(None, "g", request(), T0, options, "a")
    assert g is not None
    assert g.state is ClassicState.PREPARING_REBALANCE
    assert classic.next_deadline(g, {}) == T0 + 3000
    done = classic.advance(g, {}, T0 + 3000, options)
    assert done is not None
    assert done.state is ClassicState.COMPLETING_REBALANCE


def test_a_lone_first_member_waits_only_the_quiet_period() -> None:
    options = OPTIONS.model_copy(
        update={"initial_rebalance_delay_ms": 3000, "initial_rebalance_quiet_ms": 300}
    )
    g, _ = classic.join(None, "g", request(), T0, options, "a")
    assert g is not None
    assert classic.next_deadline(g, {}) == T0 + 300
    assert classic.advance(g, {}, T0 + 299, options) is None
    done = classic.advance(g, {}, T0 + 300, options)
    assert done is not None
    assert done.state is ClassicState.COMPLETING_REBALANCE
    assert [m.member_id for m in done.members] == ["a"]


def test_members_arriving_together_join_one_generation_within_the_cap() -> None:
    options = OPTIONS.model_copy(
        update={"initial_rebalance_delay_ms": 1000, "initial_rebalance_quiet_ms": 300}
    )
    g, _ = classic.join(None, "g", request(), T0, options, "m0")
    for n in range(1, 5):  # one every 200 ms: each arrives within the quiet period
        assert g is not None
        g, _ = classic.join(g, "g", request(), T0 + 200 * n, options, f"m{n}")
    assert g is not None
    assert g.state is ClassicState.PREPARING_REBALANCE
    assert classic.next_deadline(g, {}) == T0 + 1000  # the cap, not 800 + 300
    done = classic.advance(g, {}, T0 + 1000, options)
    assert done is not None
    assert done.state is ClassicState.COMPLETING_REBALANCE
    assert len(done.members) == 5


def test_leader_receives_every_members_metadata_and_followers_none() -> None:
    g = stable_pair()
    assert classic.join_members(g, "a") == [("a", None, b"r"), ("b", None, b"r")]
    assert classic.join_members(g, "b") == []


def test_protocol_is_the_one_most_members_prefer() -> None:
    g, _ = join(None, request(protocols=(("rr", b""), ("range", b""))), new_id="a")
    g, _ = join(g, request(protocols=(("range", b""), ("rr", b""))), new_id="b")
    g, _ = join(g, request(protocols=(("range", b""),)), new_id="c")
    g, _ = join(g, request("a", protocols=(("rr", b""), ("range", b""))))
    g, _ = join(g, request("b", protocols=(("range", b""), ("rr", b""))))
    assert g.protocol_name == "range"


def test_member_without_a_common_protocol_is_inconsistent() -> None:
    _, outcome = join(stable_pair(), request(protocols=(("sticky", b""),)), new_id="c")
    assert outcome == classic.JoinError(ErrorCode.inconsistent_group_protocol)


def test_other_protocol_type_is_inconsistent_for_a_non_empty_group() -> None:
    _, outcome = join(stable_pair(), request(protocol_type="connect"), new_id="c")
    assert outcome == classic.JoinError(ErrorCode.inconsistent_group_protocol)


def test_session_timeout_outside_the_allowed_range_is_rejected() -> None:
    _, outcome = join(None, request(session_timeout_ms=10))
    assert outcome == classic.JoinError(ErrorCode.invalid_session_timeout)


def test_leader_sync_stores_assignments_and_followers_read_theirs() -> None:
    g = stable_pair()
    assert g.state is ClassicState.STABLE
    assert classic.sync_result(g, "b", g.generation) == classic.SyncNow(b"B")


def test_follower_sync_waits_for_the_leader() -> None:
    g, _ = join(None, request(), new_id="a")
    g, _ = join(g, request(), new_id="b")
    g, _ = join(g, request("a"))
    _, outcome = classic.sync(g, "b", None, g.generation, None, None, {}, T0)
    assert outcome == classic.SyncWait(g.generation)


def test_sync_with_an_old_generation_is_illegal() -> None:
    g = stable_pair()
    _, outcome = classic.sync(g, "a", None, g.generation - 1, None, None, {}, T0)
    assert outcome == classic.SyncError(ErrorCode.illegal_generation)


def test_heartbeat_answers() -> None:
    g = stable_pair()
    assert classic.heartbeat(g, "a", None, g.generation) is ErrorCode.none
    assert classic.heartbeat(g, "zz", None, g.generation) is ErrorCode.unknown_member_id
    assert classic.heartbeat(g, "a", None, g.generation + 1) is ErrorCode.illegal_generation
    preparing, _ = join(g, request(), new_id="c")
    assert classic.heartbeat(preparing, "a", None, g.generation) is ErrorCode.rebalance_in_progress


def test_leaving_member_triggers_a_rebalance_of_the_others() -> None:
    g, errors = classic.leave(stable_pair(), [("b", None)], T0, OPTIONS)
    assert errors == [ErrorCode.none]
    assert g is not None
    assert g.state is ClassicState.PREPARING_REBALANCE
    assert [m.member_id for m in g.members] == ["a"]


def test_last_member_leaving_empties_the_group_and_bumps_the_generation() -> None:
    g = stable_pair()
    empty, _ = classic.leave(g, [("a", None), ("b", None)], T0, OPTIONS)
    assert empty is not None
    assert empty.state is ClassicState.EMPTY
    assert empty.generation == g.generation + 1


def test_leave_of_an_unknown_member_is_reported_per_member() -> None:
    _, errors = classic.leave(stable_pair(), [("a", None), ("zz", None)], T0, OPTIONS)
    assert errors == [ErrorCode.none, ErrorCode.unknown_member_id]


def test_silent_member_is_removed_after_its_session_timeout() -> None:
    g = stable_pair()
    alive = {"a": T0 + 9_000}
    assert classic.advance(g, alive, T0 + 9_999, OPTIONS) is None
    after = classic.advance(g, alive, T0 + 10_000, OPTIONS)
    assert after is not None
    assert [m.member_id for m in after.members] == ["a"]
    assert after.state is ClassicState.PREPARING_REBALANCE


def test_members_that_do_not_rejoin_by_the_rebalance_deadline_are_dropped() -> None:
    g, _ = join(stable_pair(), request(), new_id="c")
    g, _ = join(g, request("a"), now=T0 + 1)
    done = classic.advance(g, {"b": T0 + 40_000}, g.deadline_ms, OPTIONS)
    assert done is not None
    assert done.state is ClassicState.COMPLETING_REBALANCE
    assert sorted(m.member_id for m in done.members) == ["a", "c"]


def test_leader_that_heartbeats_but_never_syncs_restarts_the_rebalance() -> None:
    g, _ = join(None, request(), new_id="a")
    alive = {"a": g.deadline_ms - 1}
    assert classic.advance(g, alive, g.deadline_ms - 1, OPTIONS) is None
    again = classic.advance(g, alive, g.deadline_ms, OPTIONS)
    assert again is not None
    assert again.state is ClassicState.PREPARING_REBALANCE


def test_leader_gone_after_the_join_is_removed_at_its_session_timeout() -> None:
    g, _ = join(None, request(), new_id="a")
    g, _ = join(g, request(), new_id="b")
    g, _ = join(g, request("a"))
    assert (g.state, g.leader) == (ClassicState.COMPLETING_REBALANCE, "a")
    follower_waiting = {"b": T0 + 9_500}  # kept alive by the broker holding its SyncGroup
    assert classic.advance(g, follower_waiting, T0 + 9_999, OPTIONS) is None
    after = classic.advance(g, follower_waiting, T0 + 10_000, OPTIONS)
    assert after is not None
    assert g.deadline_ms > T0 + 10_000  # the sync deadline is still far off
    assert [m.member_id for m in after.members] == ["b"]
    assert after.state is ClassicState.PREPARING_REBALANCE
    assert classic.sync_result(after, "b", g.generation) == classic.SyncError(
        ErrorCode.rebalance_in_progress
    )


def test_restarted_static_leader_takes_over_its_identity_and_leadership() -> None:
    g, _ = join(None, request(instance="i1"), new_id="a")
    g, _ = classic.sync(g, "a", "i1", 1, None, None, {"a": b"A"}, T0)  # type: ignore[assignment]
    g, outcome = join(g, request(instance="i1"), new_id="a2")
    # The leader must be able to assign again, so its return does rebalance.
    assert outcome == classic.JoinWait("a2", after=1)
    assert [m.member_id for m in g.members] == ["a2"]
    assert g.leader == "a2"


def test_static_follower_restart_in_a_stable_group_is_answered_at_once() -> None:
    g, _ = join(None, request(instance="i1"), new_id="a")
    g, _ = join(g, request(instance="i2"), new_id="b")
    g, _ = join(g, request("a", instance="i1"))
    g, _ = classic.sync(g, "a", "i1", g.generation, None, None, {"a": b"A", "b": b"B"}, T0)  # type: ignore[assignment]
    g2, outcome = join(g, request(instance="i2"), new_id="b2")
    assert outcome == classic.JoinNow("b2")
    assert g2.state is ClassicState.STABLE
    assert g2.generation == g.generation
    assert classic.sync_result(g2, "b2", g.generation) == classic.SyncNow(b"B")


def test_old_member_id_of_a_restarted_static_member_is_fenced() -> None:
    g, _ = join(None, request(instance="i1"), new_id="a")
    g, _ = join(g, request(instance="i1"), new_id="a2")
    assert classic.heartbeat(g, "a", "i1", g.generation) is ErrorCode.fenced_instance_id


def test_commit_rules_follow_the_generation() -> None:
    g = stable_pair()
    assert classic.commit_error(g, "a", None, g.generation) is ErrorCode.none
    assert classic.commit_error(g, "a", None, g.generation - 1) is ErrorCode.illegal_generation
    assert classic.commit_error(g, "zz", None, g.generation) is ErrorCode.unknown_member_id
    assert classic.commit_error(g, "", None, -1) is ErrorCode.unknown_member_id  # group busy
    assert classic.commit_error(None, "", None, -1) is ErrorCode.none  # admin, no group yet
    assert classic.commit_error(None, "a", None, 3) is ErrorCode.illegal_generation


def test_transactional_commits_are_fenced_by_member_generation_and_instance() -> None:
    g = stable_pair()
    assert classic.txn_commit_error(g, "a", None, g.generation) is ErrorCode.none
    assert classic.txn_commit_error(g, "a", None, g.generation - 1) is ErrorCode.illegal_generation
    assert classic.txn_commit_error(g, "zz", None, g.generation) is ErrorCode.unknown_member_id
    static, _ = join(None, request(instance="i1"), new_id="s1")
    static, _ = join(static, request(instance="i1"), new_id="s2")  # the instance restarted
    assert (
        classic.txn_commit_error(static, "s1", "i1", static.generation)
        is ErrorCode.fenced_instance_id
    )
    assert classic.txn_commit_error(static, "s2", "i1", static.generation) is ErrorCode.none


def test_transactional_commits_naming_no_member_are_taken_in_any_state() -> None:
    """TxnOffsetCommit before v3 names no member; a producer outside the group commits so."""
    busy, _ = join(None, request(), new_id="a")
    assert busy.state is ClassicState.COMPLETING_REBALANCE
    assert classic.txn_commit_error(busy, "", None, -1) is ErrorCode.none
    assert classic.txn_commit_error(stable_pair(), "", None, -1) is ErrorCode.none
    assert classic.txn_commit_error(None, "", None, -1) is ErrorCode.none
    assert classic.txn_commit_error(None, "a", None, 1) is ErrorCode.illegal_generation


def test_a_current_member_commits_transactionally_while_the_group_rebalances() -> None:
    g, _ = join(None, request(), new_id="a")  # CompletingRebalance
    assert classic.commit_error(g, "a", None, g.generation) is ErrorCode.rebalance_in_progress
    assert classic.txn_commit_error(g, "a", None, g.generation) is ErrorCode.none


def test_commit_during_completing_rebalance_is_refused_as_rebalance_in_progress() -> None:
    g, _ = join(None, request(), new_id="a")
    assert classic.commit_error(g, "a", None, g.generation) is ErrorCode.rebalance_in_progress
