"""Topics: names, ids, partitions (one stream each) and configs, in the metadata store.

A topic record lives at ``topics/<name>``. Every broker keeps all topic records in memory,
refreshed by notifications; a miss is re-checked in the store, so a topic created through
another broker is visible at once.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

import msgpack
from kio.schema.errors import ErrorCode

from icefloe.errors import (
    AlreadyExistsError,
    ConflictError,
    KafkaError,
    NotFoundError,
)
from icefloe.keyspace import DELETED_TOPICS, TOPICS, prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, Follower, WatchEvent
from icefloe.storage.engine import StreamStorage
from icefloe.table_names import (
    DEFAULT_TEMPLATE,
    IDENTIFIER_CONFIG,
    TableName,
    topic_table_name,
)
from icefloe.topics import internal

log = logging.getLogger(__name__)

MAX_NAME_LENGTH: Final = 249
_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")
MAX_PARTITIONS: Final = 10_000


class TopicError(KafkaError):
    """A topic operation that Kafka answers with an error code."""


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    streams: tuple[int, ...]
    """Stream id of each partition, by partition index."""
    configs: dict[str, str] = field(default_factory=dict)
    created_ms: int = 0
    version: int = 0
    """Metadata-store version of the record, for compare-and-set updates."""

    @property
    def partitions(self) -> int:
        return len(self.streams)

    def encode(self) -> bytes:
        payload = {
            "id": self.topic_id.bytes,
            "streams": list(self.streams),
            "configs": self.configs,
            "created_ms": self.created_ms,
        }
        return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, name: str, value: bytes, version: int) -> Topic:
        p = msgpack.unpackb(value, raw=False)
        return cls(
            name,
            uuid.UUID(bytes=p["id"]),
            tuple(p["streams"]),
            p["configs"],
            p["created_ms"],
            version,
        )


@dataclass(frozen=True, slots=True)
class DeletedTopic:
    """A deleted topic, remembered until its tables are dropped."""

    topic: Topic
    deleted_ms: int

    def encode(self) -> bytes:
        payload = [self.topic.name, self.topic.encode(), self.deleted_ms]
        return msgpack.packb(payload, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, value: bytes) -> DeletedTopic:
        name, record, deleted_ms = msgpack.unpackb(value, raw=False)
        return cls(Topic.decode(name, record, 0), deleted_ms)


def is_legal_topic_name(name: str) -> bool:
    """Whether a topic could have this name (a client may ask for any string)."""
    return (
        0 < len(name) <= MAX_NAME_LENGTH
        and name not in (".", "..")
        and _LEGAL_NAME.fullmatch(name) is not None
    )


def validate_topic_name(name: str) -> None:
    """Kafka's rules for topic names.

    Raises:
        TopicError: ``invalid_topic_exception`` with the reason.
    """
    if not name or name in (".", ".."):
        raise TopicError(ErrorCode.invalid_topic_exception, f"topic name {name!r} is not allowed")
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"topic name is longer than {MAX_NAME_LENGTH} characters",
        )
    if not _LEGAL_NAME.fullmatch(name):
        raise TopicError(
            ErrorCode.invalid_topic_exception,
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'",
        )


TIME_PARTITION: Final = "icefloe.table.partition.time"
"""The one topic config that cannot change after creation (see ``icefloe.topics.configs``)."""


class TopicRegistry:
    """Every topic of the cluster, cached in memory and kept fresh by notifications."""

    def __init__(self, storage: StreamStorage, table_template: str = DEFAULT_TEMPLATE) -> None:
        """``table_template`` is the cluster's ``[table] identifier``."""
        self._storage = storage
        self._table_template = table_template
        self._metadata = storage.metadata
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        self._changes = 0
        """Counts the cache's changes: a store read that one overtook may be stale."""
        self._follower: Follower | None = None

    async def start(self) -> None:
        watch = await self._metadata.watch(TOPICS)  # before the reload: no change is missed
        await self._reload()
        self._follower = Follower(watch, self._apply, "topic-registry")

    async def close(self) -> None:
        if self._follower is not None:
            await self._follower.stop()

    def cached(self) -> list[Topic]:
        """Every topic this broker knows of, by name."""
        return sorted(self._topics.values(), key=lambda t: t.name)

    def get_cached(self, name: str) -> Topic | None:
        """The topic ``name`` if this broker knows of it."""
        return self._topics.get(name)

    async def get(self, name: str) -> Topic | None:
        """The topic ``name``, checking the store when the cache does not have it."""
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        if not is_legal_topic_name(name) or internal.is_internal(name):
            # No stored topic has it (the internal topic is virtual), and it may not even
            # make a valid store key.
            return None
        changes = self._changes
        record = await self._metadata.get(TOPICS + name)
        if record is None:
            return None
        topic = Topic.decode(name, record.value, record.version)
        if self._changes == changes:
            # Not if the cache changed while the store answered: the topic may have been
            # deleted meanwhile, its deletion already applied, and no later event would take
            # back a topic remembered after it.
            self._remember(topic)
        return topic

    def table_name(self, topic: Topic) -> TableName:
        """The identifier of ``topic``'s table."""
        return self.table_name_of(topic.name, topic.configs)

    def table_name_of(self, name: str, configs: Mapping[str, str]) -> TableName:
        """The identifier of the table of a topic ``name`` with ``configs``."""
        return topic_table_name(self._table_template, name, configs)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    async def create(
        self, name: str, partitions: int, configs: dict[str, str] | None = None
    ) -> Topic:
        """Create a topic with ``partitions`` new streams.

        Raises:
            TopicError: invalid name or partition count, or the topic exists.
        """
        validate_topic_name(name)
        refused = internal.creation_refused(name)
        if refused is not None:
            raise TopicError(*refused)
        _check_partition_count(partitions)
        if await self.get(name) is not None:
            raise TopicError(ErrorCode.topic_already_exists, f"topic {name!r} already exists")
        self._check_table_name(name, configs or {})
        topic_id = uuid.uuid4()
        streams = [await self._storage.create_stream(f"{topic_id}/{p}") for p in range(partitions)]
        topic = Topic(name, topic_id, tuple(streams), dict(configs or {}), int(time.time() * 1000))
        try:
            record = await self._metadata.put(
                TOPICS + name, topic.encode(), expected_version=MUST_NOT_EXIST
            )
        except AlreadyExistsError:
            # Lost a race with another broker; our streams stay empty and unreferenced.
            raise TopicError(
                ErrorCode.topic_already_exists, f"topic {name!r} already exists"
            ) from None
        topic = replace(topic, version=record.version)
        self._remember(topic)
        return topic

    async def delete(self, name: str) -> Topic:
        """Delete a topic and the index of its streams (their WAL objects become orphans).

        The topic is remembered as deleted until the compaction leader has dropped its tables
        (:meth:`deleted`), so that a topic created again under the name starts with new ones.

        Raises:
            TopicError: ``unknown_topic_or_partition``; ``invalid_request`` for the internal
                topic.
        """
        if internal.is_internal(name):
            raise TopicError(*internal.deletion_refused())
        topic = await self._require(name)
        # Remembered first: a crash after the record is gone must not leave its tables behind.
        deleted = DeletedTopic(topic, int(time.time() * 1000))
        await self._metadata.put(DELETED_TOPICS + topic.topic_id.hex, deleted.encode())
        try:
            await self._metadata.delete(TOPICS + name, expected_version=topic.version)
        except (ConflictError, NotFoundError):
            raise TopicError(
                ErrorCode.unknown_topic_or_partition,
                f"topic {name!r} changed or was deleted meanwhile",
            ) from None
        self._forget(name)
        for stream_id in topic.streams:
            await self._storage.delete_stream(stream_id)
        return topic

    async def deleted(self) -> list[DeletedTopic]:
        """Deleted topics whose tables are not dropped yet, oldest first.

        A topic whose record is still there (its deletion failed or is under way) is not
        listed: its tables are still in use.
        """
        found = []
        async for record in self._metadata.scan_all(DELETED_TOPICS, prefix_end(DELETED_TOPICS)):
            try:
                deleted = DeletedTopic.decode(record.value)
            except (ValueError, TypeError, KeyError):
                log.warning("ignoring the malformed deleted-topic record %s", record.key)
                continue
            live = await self._metadata.get(TOPICS + deleted.topic.name)
            if live is None or Topic.decode("", live.value, 0).topic_id != deleted.topic.topic_id:
                found.append(deleted)
        return sorted(found, key=lambda d: d.deleted_ms)

    async def forget_deleted(self, deleted: DeletedTopic) -> None:
        """Stop remembering a deleted topic: its tables are dropped."""
        with contextlib.suppress(NotFoundError):
            await self._metadata.delete(DELETED_TOPICS + deleted.topic.topic_id.hex)

    async def add_partitions(self, name: str, total: int) -> Topic:
        """Grow a topic to ``total`` partitions.

        Raises:
            TopicError: unknown topic, or ``invalid_partitions`` if ``total`` does not grow it.
        """
        _check_partition_count(total)

        async def grow(topic: Topic) -> Topic:
            if total <= topic.partitions:
                raise TopicError(
                    ErrorCode.invalid_partitions,
                    f"topic {name!r} has {topic.partitions} partitions; "
                    "the new count must be larger",
                )
            more = [
                await self._storage.create_stream(f"{topic.topic_id}/{p}")
                for p in range(topic.partitions, total)
            ]
            return replace(topic, streams=topic.streams + tuple(more))

        return await self._update(name, grow)

    async def set_configs(self, name: str, configs: dict[str, str]) -> Topic:
        """Replace the topic's configs (validated by the caller)."""

        async def reconfigure(topic: Topic) -> Topic:
            self._check_table_name(name, configs)
            before, after = (c.get(TIME_PARTITION, "none") for c in (topic.configs, configs))
            if before != after:
                raise TopicError(
                    ErrorCode.invalid_config,
                    f"{TIME_PARTITION} is set when a topic is created (topic {name!r} has "
                    f"{before}); its tables cannot change partitioning",
                )
            return replace(topic, configs=dict(configs))

        return await self._update(name, reconfigure)

    async def _update(self, name: str, change: Callable[[Topic], Awaitable[Topic]]) -> Topic:
        """Apply ``change`` by compare-and-set, re-reading the topic after a lost race."""
        while True:
            record = await self._metadata.get(TOPICS + name) if is_legal_topic_name(name) else None
            if record is None:
                raise TopicError(
                    ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist"
                )
            topic = Topic.decode(name, record.value, record.version)
            new = await change(topic)
            try:
                written = await self._metadata.put(
                    TOPICS + name, new.encode(), expected_version=topic.version
                )
            except ConflictError:
                continue
            updated = replace(new, version=written.version)
            self._remember(updated)
            return updated

    def _check_table_name(self, name: str, configs: dict[str, str]) -> None:
        """Refuse a topic whose table identifier another topic's table already has (as
        Kafka refuses topic names that differ only in '.' and '_')."""
        wanted = self.table_name_of(name, configs)
        for other in self._topics.values():
            if other.name != name and self.table_name(other) == wanted:
                alias = bool(configs.get(IDENTIFIER_CONFIG))
                raise TopicError(
                    ErrorCode.invalid_config if alias else ErrorCode.invalid_topic_exception,
                    f"topic {name!r} would share the table {wanted} with topic {other.name!r}; "
                    f"give one of them its own identifier with the topic config "
                    f"{IDENTIFIER_CONFIG}",
                )

    async def _require(self, name: str) -> Topic:
        topic = await self.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        return topic

    def _remember(self, topic: Topic) -> None:
        if internal.is_internal(topic.name):
            return  # a record left by an older version: the virtual topic stands in its place
        old = self._topics.get(topic.name)
        if old is not None and old.version > topic.version:
            return
        self._changes += 1
        if old is not None:
            self._by_id.pop(old.topic_id, None)
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    def _forget(self, name: str) -> None:
        self._changes += 1
        old = self._topics.pop(name, None)
        if old is not None:
            self._by_id.pop(old.topic_id, None)

    async def _reload(self) -> None:
        records = [r async for r in self._metadata.scan_all(TOPICS, prefix_end(TOPICS))]
        self._changes += 1
        self._topics.clear()
        self._by_id.clear()
        for record in records:
            self._remember(Topic.decode(record.key[len(TOPICS) :], record.value, record.version))

    async def _apply(self, event: WatchEvent) -> None:
        if event.key is None:  # RESET
            await self._reload()
            return
        name = event.key[len(TOPICS) :]
        record = await self._metadata.get(event.key)
        if record is None:
            self._forget(name)
        else:
            self._remember(Topic.decode(name, record.value, record.version))


def _check_partition_count(partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise TopicError(
            ErrorCode.invalid_partitions,
            f"a topic needs between 1 and {MAX_PARTITIONS} partitions, got {partitions}",
        )
