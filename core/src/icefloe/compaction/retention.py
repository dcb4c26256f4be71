"""``retention.ms`` and ``retention.bytes``: old index entries leave the stream.

Entries go from the front of the log, whole, as Kafka deletes whole segments: by age once an
entry was written and its newest record stamped more than ``retention.ms`` ago, by size while
the rest of the log still holds ``retention.bytes``. Both times count because an entry is a
much smaller unit than a Kafka segment: records produced today with last year's timestamps
stay for ``retention.ms`` after they were written, as they would in Kafka's active segment.

The last entry always stays: it carries the log end offset, which must never go back. Kafka's
defaults apply (7 days, no size limit, ``cleanup.policy=delete``); a compact-only topic keeps
everything until log compaction exists. Entries wholly before the log start that DeleteRecords
set go too, whatever the policy (the records in an entry that straddles it stay stored, and
unreadable). A WAL object no entry references any more is collected as an orphan.

Rows that reached the tables stay there by default (``icefloe.table.retention=keep``). With
``delete``, the expiry is a saga task instead (:class:`TaskKind.EXPIRE`): the expired entries'
data files leave every table in one commit per format, then the entries leave the index, and
the files are deleted after the topic's history period. Records that DeleteRecords put before
the log start follow the same choice: under ``keep`` the tables keep the rows they have (records
deleted while still in the WAL may reach them too, if compaction takes them first); under
``delete`` the files of the entries wholly before the log start leave the tables.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator

from icefloe.compaction.planner import Plan, StreamPlan, TaskKind
from icefloe.ports.compaction import CompactionTask
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import IndexEntry
from icefloe.topics.configs import effective_value, split_list
from icefloe.topics.registry import Topic


async def expired_entries(
    storage: StreamStorage, topic: Topic, stream_id: int, now_ms: int
) -> list[IndexEntry]:
    """The stream's leading entries that retention removes (never the last one): those past
    ``retention.ms`` or ``retention.bytes`` under ``cleanup.policy=delete``, and, whatever the
    policy, those wholly before the log start DeleteRecords set.

    The index is read from its front only as far as entries expire (a long log that keeps
    a week costs one entry or two), except under ``retention.bytes``, which needs the whole
    log's size first.
    """
    configs = topic.configs
    deleting = "delete" in split_list(effective_value(configs, "cleanup.policy", storage.options))
    retention_ms = int(effective_value(configs, "retention.ms", storage.options))
    retention_bytes = int(effective_value(configs, "retention.bytes", storage.options))
    by_size = deleting and retention_bytes >= 0
    log_start = await storage.index.recorded_log_start(stream_id)
    if not (deleting and retention_ms >= 0) and not by_size and log_start == 0:
        return []  # nothing can expire: no need to read the index
    if by_size:
        whole = await storage.index.scan(stream_id)
        remaining = sum(e.size for e in whole)
        entries: AsyncGenerator[IndexEntry, None] = _each(whole)
    else:
        remaining = 0
        entries = storage.index.entries(stream_id)
    expired: list[IndexEntry] = []
    async with contextlib.aclosing(entries):
        async for entry in entries:
            newest = max(entry.max_timestamp, entry.created_ms)
            too_old = deleting and retention_ms >= 0 and newest < now_ms - retention_ms
            too_big = by_size and remaining - entry.size >= retention_bytes
            if not (too_old or too_big or entry.end <= log_start):
                return expired
            expired.append(entry)
            remaining -= entry.size
    return expired[:-1]  # every entry expired: the last stays, holding the log end


async def _each(entries: list[IndexEntry]) -> AsyncGenerator[IndexEntry, None]:
    for entry in entries:
        yield entry


async def enforce(storage: StreamStorage, topic: Topic, now_ms: int) -> int:
    """Remove the topic's expired entries, oldest first; return how many went."""
    removed = 0
    for stream_id in topic.streams:
        expired = await expired_entries(storage, topic, stream_id, now_ms)
        removed += await storage.offset_index.expire(stream_id, expired)
    return removed


async def plan_expiry(storage: StreamStorage, topic: Topic, now_ms: int) -> Plan | None:
    """The topic's expired entries as one expiry task, or ``None`` when none expired."""
    streams = []
    for partition, stream_id in enumerate(topic.streams):
        expired = await expired_entries(storage, topic, stream_id, now_ms)
        if expired:
            streams.append(StreamPlan(topic.name, partition, stream_id, tuple(expired)))
    if not streams:
        return None
    return Plan((CompactionTask(uuid.uuid4().hex, (), ()),), tuple(streams), TaskKind.EXPIRE)
