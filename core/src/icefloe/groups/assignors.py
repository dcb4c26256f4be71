"""KIP-848 server-side assignors: ``uniform`` (the default) and ``range``.

An assignor maps each member to the partitions it should own, given what each member subscribes
to (resolved topic names), the topics, and the current target (for stickiness). Both are
deterministic: every broker computes the same assignment from the same input.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Final

from icefloe.groups.model import Assignment, TopicInfo

Subscriptions = Mapping[str, frozenset[str]]
"""Topic names each member subscribes to, by member id."""

Assignor = Callable[
    [Subscriptions, Mapping[str, TopicInfo], Mapping[str, Assignment]], dict[str, Assignment]
]

_TopicPartition = tuple[str, int]


def uniform(
    subscriptions: Subscriptions,
    topics: Mapping[str, TopicInfo],
    current: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Spread partitions evenly, moving as few as possible from the current target.

    Every member keeps what it has (if still subscribed); unowned partitions go to the least
    loaded member subscribed to their topic; then partitions move, one at a time, from a member
    to a less loaded eligible one while that narrows a gap of two or more. With the same
    subscriptions everywhere this ends with counts differing by at most one.
    """
    members = sorted(subscriptions)
    names = {info.topic_id: name for name, info in topics.items()}
    eligible: dict[str, list[str]] = {
        topic: [m for m in members if topic in subscriptions[m]]
        for topic in sorted({t for subs in subscriptions.values() for t in subs} & set(topics))
    }
    owner: dict[_TopicPartition, str] = {}
    for member in members:
        for topic_id, partitions in sorted(current.get(member, {}).items()):
            topic = names.get(topic_id)
            if topic is None or member not in eligible.get(topic, ()):
                continue
            for p in sorted(partitions):
                if p < topics[topic].partitions and (topic, p) not in owner:
                    owner[(topic, p)] = member
    counts = {m: 0 for m in members}
    for member in owner.values():
        counts[member] += 1
    for topic, candidates in eligible.items():
        for p in range(topics[topic].partitions):
            if (topic, p) not in owner and candidates:
                chosen = min(candidates, key=lambda m: (counts[m], m))
                owner[(topic, p)] = chosen
                counts[chosen] += 1
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner):
            holder = owner[tp]
            target = min(eligible[tp[0]], key=lambda m: (counts[m], m))
            if counts[target] < counts[holder] - 1:
                owner[tp] = target
                counts[holder] -= 1
                counts[target] += 1
                moved = True
    return _by_member(members, owner, topics)


def range_(
    subscriptions: Subscriptions,
    topics: Mapping[str, TopicInfo],
    current: Mapping[str, Assignment],
) -> dict[str, Assignment]:
    """Per topic, contiguous ranges of partitions to its subscribers in member id order.

    The first ``partitions % subscribers`` members get one more. Members subscribed to the same
    topics get the same partition numbers of each, which co-partitioned joins rely on.
    """
    members = sorted(subscriptions)
    owner: dict[_TopicPartition, str] = {}
    for topic in sorted({t for subs in subscriptions.values() for t in subs} & set(topics)):
        subscribers = [m for m in members if topic in subscriptions[m]]
        count = topics[topic].partitions
        base, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            size = base + (1 if i < extra else 0)
            for p in range(start, start + size):
                owner[(topic, p)] = member
            start += size
    return _by_member(members, owner, topics)


def _by_member(
    members: list[str], owner: Mapping[_TopicPartition, str], topics: Mapping[str, TopicInfo]
) -> dict[str, Assignment]:
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in members}
    for (topic, p), member in owner.items():
        out[member].setdefault(topics[topic].topic_id, set()).add(p)
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in out.items()}


ASSIGNORS: Final[dict[str, Assignor]] = {"uniform": uniform, "range": range_}
