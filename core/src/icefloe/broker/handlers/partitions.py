"""What the data-path handlers share: a partition's stream, its leader epoch, its owner.

Icefloe partitions have no leader that could change: any broker serves any partition, so
every partition stays at leader epoch 0 forever, and the Metadata "leader" is only the
advisory owner that :mod:`icefloe.cluster` picks for cache locality.
"""

from __future__ import annotations

import logging
from typing import Final

from kio.schema.errors import ErrorCode

from icefloe.broker.server import RequestContext
from icefloe.cluster import client_zone
from icefloe.errors import CorruptDataError, IcefloeError, LostDataError
from icefloe.quiet_log import QuietLog
from icefloe.topics import internal

log = logging.getLogger(__name__)

LEADER_EPOCH: Final = 0
"""The leader epoch of every partition: leadership never moves, so it never grows."""
NO_EPOCH: Final = -1
"""What a client sends when it does not know the epoch (Kafka's ``NO_PARTITION_LEADER_EPOCH``)."""


async def stream_of(ctx: RequestContext, topic: str, partition: int) -> int | None:
    """The stream id of ``topic``/``partition``, or ``None`` if there is no such partition."""
    found = await ctx.broker.topics.get(topic)
    if found is None or not 0 <= partition < found.partitions:
        return None
    return found.streams[partition]


def owned_elsewhere(ctx: RequestContext, topic: str, partition: int) -> bool:
    """Whether ``broker.strict_ownership`` sends this partition's clients to another broker.

    Ownership is per zone: the owner is the one Metadata names to a client of this zone.
    """
    broker = ctx.broker
    if not broker.options.strict_ownership:
        return False
    if internal.is_internal(topic):
        count = internal.PARTITIONS
    elif (known := broker.topics.get_cached(topic)) is not None:
        count = known.partitions
    else:
        return False  # no such topic: the caller says so
    if not 0 <= partition < count:
        return False
    owner = broker.cluster.owner(topic, count, partition, client_zone(ctx.client_id))
    return owner.node_id != broker.me.node_id


def leader_epoch_error(current_leader_epoch: int) -> ErrorCode | None:
    """Kafka's fencing check of the epoch a client believes the partition is at.

    An older epoch means the client's metadata is stale (FENCED_LEADER_EPOCH), a newer one
    that this broker is (UNKNOWN_LEADER_EPOCH); both make the client refresh its metadata.
    """
    if current_leader_epoch in (NO_EPOCH, LEADER_EPOCH):
        return None
    if current_leader_epoch > LEADER_EPOCH:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.fenced_leader_epoch


def read_error(exc: IcefloeError, what: str) -> ErrorCode:
    """The error for a partition whose storage read failed (fetch, list offsets).

    KAFKA_STORAGE_ERROR is what Kafka answers when a log directory is offline: every client
    retries it after refreshing its metadata. That is right when the metadata store or the
    WAL is briefly unreachable, and the honest answer when a stored object is missing or
    corrupt (the operator must act; the log says which object, once a minute, not once per
    retry). Anything else is a fault worth a traceback.
    """
    if exc.retriable:
        _storage_log.warning(f"{what}: storage unavailable: {exc}")
        return ErrorCode.kafka_storage_error
    if isinstance(exc, LostDataError | CorruptDataError):
        _storage_log.error(f"{what}: {exc}")
        return ErrorCode.kafka_storage_error
    log.error("%s failed", what, exc_info=exc)
    return ErrorCode.unknown_server_error


_storage_log = QuietLog(log, every_s=60)
