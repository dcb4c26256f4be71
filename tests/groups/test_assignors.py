"""Server-side assignors: every partition owned once, balance, stickiness, ranges."""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from icefloe.groups.assignors import range_, uniform
from icefloe.groups.model import Assignment, TopicInfo

A, B = uuid.UUID(int=1), uuid.UUID(int=2)
TOPICS = {"a": TopicInfo(A, 12), "b": TopicInfo(B, 5)}


def owners(assignment: dict[str, Assignment]) -> Counter[tuple[uuid.UUID, int]]:
    return Counter((t, p) for a in assignment.values() for t, ps in a.items() for p in ps)


def counts(assignment: dict[str, Assignment]) -> list[int]:
    return sorted(sum(len(ps) for ps in a.values()) for a in assignment.values())


def test_uniform_spreads_evenly() -> None:
    subs = {m: frozenset({"a"}) for m in ("m1", "m2", "m3")}
    assert counts(uniform(subs, TOPICS, {})) == [4, 4, 4]


def test_uniform_moves_only_what_balance_needs_when_a_member_joins() -> None:
    subs = {m: frozenset({"a"}) for m in ("m1", "m2", "m3")}
    before = uniform(subs, TOPICS, {})
    after = uniform({**subs, "m4": frozenset({"a"})}, TOPICS, before)
    assert counts(after) == [3, 3, 3, 3]
    for member in ("m1", "m2", "m3"):
        assert after[member][A] <= before[member][A]  # nobody gains someone else's partition


def test_uniform_gives_partitions_only_to_subscribers() -> None:
    subs = {"m1": frozenset({"a"}), "m2": frozenset({"b"})}
    out = uniform(subs, TOPICS, {})
    assert set(out["m1"]) == {A}
    assert set(out["m2"]) == {B}


def test_range_assigns_contiguous_ranges_per_topic() -> None:
    subs = {m: frozenset({"b"}) for m in ("m1", "m2")}
    out = range_(subs, TOPICS, {})
    assert out["m1"][B] == frozenset({0, 1, 2})
    assert out["m2"][B] == frozenset({3, 4})


@given(
    members=st.integers(1, 7),
    partitions=st.integers(1, 40),
    previous=st.integers(0, 7),
)
def test_every_partition_has_exactly_one_owner_and_counts_differ_by_at_most_one(
    members: int, partitions: int, previous: int
) -> None:
    topics = {"t": TopicInfo(A, partitions)}
    subs = {f"m{i}": frozenset({"t"}) for i in range(members)}
    old = uniform({f"m{i}": frozenset({"t"}) for i in range(previous)}, topics, {})
    for assignor in (uniform, range_):
        out = assignor(subs, topics, old)
        assert owners(out) == Counter({(A, p): 1 for p in range(partitions)})
        assert counts(out)[-1] - counts(out)[0] <= 1
