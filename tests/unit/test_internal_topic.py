"""The internal topic's names, ids and refusals (icefloe.topics.internal)."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from icefloe.topics import internal


def test_the_exact_name_already_exists_and_dotted_spellings_collide() -> None:
    assert internal.creation_refused("__consumer_offsets") == (
        ErrorCode.topic_already_exists,
        "Topic '__consumer_offsets' already exists.",
    )
    for name in ("__consumer.offsets", "._consumer_offsets", "..consumer.offsets"):
        refused = internal.creation_refused(name)
        assert refused is not None
        assert refused[0] is ErrorCode.invalid_topic_exception


@pytest.mark.parametrize("name", ["__consumer_offsets2", "consumer_offsets", "__transaction_state"])
def test_other_names_may_be_created(name: str) -> None:
    assert internal.creation_refused(name) is None


def test_partitions_are_the_fifty_of_the_one_name() -> None:
    assert internal.has_partition("__consumer_offsets", 0)
    assert internal.has_partition("__consumer_offsets", 49)
    assert not internal.has_partition("__consumer_offsets", 50)
    assert not internal.has_partition("__consumer_offsets", -1)
    assert not internal.has_partition("orders", 0)


def test_the_topic_id_is_stable_per_cluster_and_differs_between_clusters() -> None:
    assert internal.topic_id("a") == internal.topic_id("a")
    assert internal.topic_id("a") != internal.topic_id("b")
