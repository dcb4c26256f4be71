"""``__consumer_offsets``: Kafka's internal topic, answered as Kafka answers it, and stored nowhere.

Consumer groups keep their committed offsets in the metadata store (:mod:`icefloe.groups`),
not in a topic. Clients and tools still expect the topic: regex subscribers leave out the
topics Metadata marks internal, and admin tools list and describe it. So every broker answers
for a virtual ``__consumer_offsets`` of :data:`PARTITIONS` partitions, marked internal, whose
log is always empty. It has no record in the topic registry and no streams: the registry
neither creates, returns nor deletes a topic of that name, and the handlers that meet it where
a partition has no stream answer for it here (an empty log, or Kafka's refusal).
"""

from __future__ import annotations

import uuid
from typing import Final

from kio.schema.errors import ErrorCode

CONSUMER_OFFSETS: Final = "__consumer_offsets"
PARTITIONS: Final = 50
"""Kafka's ``offsets.topic.num.partitions`` default."""
CONFIGS: Final[dict[str, str]] = {
    "cleanup.policy": "compact",
    "compression.type": "producer",
    "segment.bytes": str(100 * 1024 * 1024),
}
"""The configs Kafka gives the topic (those Icefloe knows of are described with them)."""

_TOPIC_ID_NAMESPACE: Final = uuid.UUID("6f1c0a52-3b7e-4d1e-9a55-7c0ffee0ff5e")


def is_internal(name: str | None) -> bool:
    """Whether ``name`` is the internal topic."""
    return name == CONSUMER_OFFSETS


def has_partition(name: str | None, partition: int) -> bool:
    """Whether ``name``/``partition`` is a partition of the internal topic."""
    return name == CONSUMER_OFFSETS and 0 <= partition < PARTITIONS


def topic_id(cluster_id: str) -> uuid.UUID:
    """The internal topic's id: the same on every broker of a cluster, different per cluster."""
    return uuid.uuid5(_TOPIC_ID_NAMESPACE, f"{cluster_id}/{CONSUMER_OFFSETS}")


Refusal = tuple[ErrorCode, str]
"""A Kafka error code and its message."""


def creation_refused(name: str) -> Refusal | None:
    """Why a topic ``name`` cannot be created beside the internal topic, if it cannot.

    As Kafka refuses it: the topic exists (TOPIC_ALREADY_EXISTS), and a name that differs from
    it only by '.' in place of '_' collides with it (INVALID_TOPIC_EXCEPTION).
    """
    if name == CONSUMER_OFFSETS:
        return ErrorCode.topic_already_exists, f"Topic '{CONSUMER_OFFSETS}' already exists."
    if name.replace(".", "_") == CONSUMER_OFFSETS:
        return (
            ErrorCode.invalid_topic_exception,
            f"Topic '{name}' collides with existing topic: {CONSUMER_OFFSETS}",
        )
    return None


def deletion_refused() -> Refusal:
    """The answer to deleting the internal topic: there is nothing stored to delete."""
    return (
        ErrorCode.invalid_request,
        f"{CONSUMER_OFFSETS} is an internal topic and cannot be deleted: committed offsets "
        "live in the metadata store; delete them per group (kafka-consumer-groups --delete "
        "or --delete-offsets)",
    )


def change_refused(what: str) -> Refusal:
    """The answer to changing the internal topic's partitions or configs."""
    return (
        ErrorCode.invalid_request,
        f"{CONSUMER_OFFSETS} is an internal topic: its {what} are fixed",
    )


def append_refused() -> Refusal:
    """Kafka's answer to a client producing to the internal topic."""
    return ErrorCode.invalid_topic_exception, f"Cannot append to internal topic {CONSUMER_OFFSETS}"


def delete_records_refused() -> Refusal:
    """Kafka's answer to DeleteRecords on the internal topic."""
    return (
        ErrorCode.invalid_topic_exception,
        f"Cannot delete records of internal topic {CONSUMER_OFFSETS}",
    )
