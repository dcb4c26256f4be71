"""Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete.

Offsets live in the metadata store (``group-offsets/<group>/<topic>/<partition>``), so they
survive every broker restart and any broker answers for them. A commit is checked against the
group record (generation for classic groups, member epoch for KIP-848 groups) and, where the
metadata store has multi-key transactions, written only if that record has not changed since.
OffsetFetch with ``require_stable`` answers UNSTABLE_OFFSET_COMMIT for a partition whose offset
an open transaction may still commit (:mod:`icefloe.transactions.pending`).
"""

from __future__ import annotations

import datetime
from typing import Any

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.groups import guarded, may_read, store_error
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import ConflictError, IcefloeError
from icefloe.groups import classic, consumer, consumer_protocol
from icefloe.groups.model import ClassicGroup, ConsumerGroup, Group
from icefloe.groups.store import CommittedOffset, GroupStore, Stored, now_ms
from icefloe.security.acls import Operation, ResourceType

_NO_THROTTLE = datetime.timedelta(0)


def _commit_error(
    group: Group | None, member_id: str, instance_id: str | None, generation: int
) -> ErrorCode:
    if isinstance(group, ConsumerGroup):
        return consumer.commit_error(group, member_id, generation)
    return classic.commit_error(group, member_id, instance_id, generation)


async def _guard_record(store: GroupStore, group_id: str) -> Stored:
    """The group record a commit is checked against, created (empty, classic) if absent:
    offsets committed outside group management still make a group that ListGroups shows."""

    def create(group: Group | None, now: int) -> tuple[Group | None, None]:
        return (ClassicGroup(group_id) if group is None else None), None

    decision = await store.update(group_id, create)
    assert decision.stored is not None
    return decision.stored


# --- OffsetCommit ---------------------------------------------------------------------------


async def handle_offset_commit(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    by_id = ctx.api_version >= 10
    registry = ctx.broker.topics
    store = ctx.broker.groups.store
    max_metadata = ctx.broker.groups.options.offset_metadata_max_bytes
    group_id = request.group_id
    member_id = request.member_id
    instance_id = getattr(request, "group_instance_id", None)
    generation = int(request.generation_id_or_member_epoch)

    # Resolve topic ids (v10) to names first: an unknown id fails only its own partitions.
    names: list[str | None] = []
    for topic in request.topics:
        if by_id:
            known = registry.by_id(topic.topic_id)
            names.append(known.name if known else None)
        else:
            names.append(topic.name)

    def answer(codes: dict[tuple[int, int], ErrorCode]) -> Any:
        topics = tuple(
            make(
                module.OffsetCommitResponseTopic,
                name=topic.name if not by_id else None,
                topic_id=topic.topic_id if by_id else None,
                partitions=tuple(
                    make(
                        module.OffsetCommitResponsePartition,
                        partition_index=p.partition_index,
                        error_code=codes[(i, j)],
                    )
                    for j, p in enumerate(topic.partitions)
                ),
            )
            for i, topic in enumerate(request.topics)
        )
        return make(module.OffsetCommitResponse, throttle_time=_NO_THROTTLE, topics=topics)

    def everywhere(code: ErrorCode) -> Any:
        return answer(
            {(i, j): code for i, t in enumerate(request.topics) for j in range(len(t.partitions))}
        )

    if not group_id:
        return everywhere(ErrorCode.invalid_group_id)
    if not may_read(ctx, group_id):
        return everywhere(ErrorCode.group_authorization_failed)

    async def run() -> Any:
        codes: dict[tuple[int, int], ErrorCode] = {}
        offsets: dict[tuple[str, int], CommittedOffset] = {}
        committed_at = now_ms()
        for i, topic in enumerate(request.topics):
            name = names[i]
            readable = name is not None and _may_read_topic(ctx, name)
            for j, p in enumerate(topic.partitions):
                metadata = p.committed_metadata
                if name is None:
                    codes[(i, j)] = ErrorCode.unknown_topic_id
                elif not readable:
                    codes[(i, j)] = ErrorCode.topic_authorization_failed
                elif metadata is not None and len(metadata.encode()) > max_metadata:
                    codes[(i, j)] = ErrorCode.offset_metadata_too_large
                else:
                    codes[(i, j)] = ErrorCode.none
                    offsets[(name, int(p.partition_index))] = CommittedOffset(
                        int(p.committed_offset),
                        int(getattr(p, "committed_leader_epoch", -1)),
                        metadata,
                        committed_at,
                    )
        while True:
            stored = await store.load(group_id)
            error = _commit_error(
                stored.group if stored else None, member_id, instance_id, generation
            )
            if error is not ErrorCode.none:
                return everywhere(error)
            if not offsets:
                return answer(codes)
            guard = stored if stored is not None else await _guard_record(store, group_id)
            try:
                await store.commit_offsets(group_id, offsets, guard)
            except ConflictError:
                continue  # the group changed since we checked: check again
            if member_id:
                await store.touch(group_id, member_id)
            return answer(codes)

    return await guarded(everywhere, run())


# --- OffsetFetch ----------------------------------------------------------------------------


async def handle_offset_fetch(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    version = ctx.api_version
    # v7+: the client waits for offsets a transaction may still change (KIP-447).
    stable = bool(getattr(request, "require_stable", False))
    if version < 8:
        return await _fetch_single(ctx, module, request, stable)
    groups = [await _fetch_group(ctx, module, g, stable) for g in request.groups]
    return make(module.OffsetFetchResponse, throttle_time=_NO_THROTTLE, groups=tuple(groups))


async def _fetch_single(ctx: RequestContext, module: Any, request: Any, stable: bool) -> Any:
    """OffsetFetch v1-v7: one group, topics by name."""
    wanted = (
        None
        if request.topics is None
        else [(t.name, t.name, list(t.partition_indexes)) for t in request.topics]
    )
    error, topics = await _offsets(ctx, request.group_id, None, -1, wanted, False, stable)

    def partition(index: int, offset: CommittedOffset | None, code: ErrorCode) -> Any:
        return make(
            module.OffsetFetchResponsePartition,
            partition_index=index,
            committed_offset=offset.offset if offset else -1,
            committed_leader_epoch=offset.leader_epoch if offset else -1,
            metadata=(offset.metadata if offset else "") or "",
            error_code=code,
        )

    return make(
        module.OffsetFetchResponse,
        throttle_time=_NO_THROTTLE,
        error_code=error,
        topics=tuple(
            make(
                module.OffsetFetchResponseTopic,
                name=name,
                partitions=tuple(partition(*p) for p in parts),
            )
            for name, _, parts in topics
        ),
    )


async def _fetch_group(ctx: RequestContext, module: Any, request: Any, stable: bool) -> Any:
    """One group of an OffsetFetch v8+ (topics by id from v10)."""
    by_id = ctx.api_version >= 10
    registry = ctx.broker.topics
    wanted: list[tuple[str | None, Any, list[int]]] | None = None
    if request.topics is not None:
        wanted = []
        for t in request.topics:
            if by_id:
                known = registry.by_id(t.topic_id)
                wanted.append(
                    (known.name if known else None, t.topic_id, list(t.partition_indexes))
                )
            else:
                wanted.append((t.name, t.name, list(t.partition_indexes)))
    error, topics = await _offsets(
        ctx,
        request.group_id,
        getattr(request, "member_id", None),
        int(getattr(request, "member_epoch", -1)),
        wanted,
        by_id,
        stable,
    )

    def partition(index: int, offset: CommittedOffset | None, code: ErrorCode) -> Any:
        return make(
            module.OffsetFetchResponsePartitions,
            partition_index=index,
            committed_offset=offset.offset if offset else -1,
            committed_leader_epoch=offset.leader_epoch if offset else -1,
            metadata=(offset.metadata if offset else "") or "",
            error_code=code,
        )

    return make(
        module.OffsetFetchResponseGroup,
        group_id=request.group_id,
        error_code=error,
        topics=tuple(
            make(
                module.OffsetFetchResponseTopics,
                name=key if not by_id else None,
                topic_id=key if by_id else None,
                partitions=tuple(partition(*p) for p in parts),
            )
            for _, key, parts in topics
        ),
    )


_Parts = list[tuple[int, CommittedOffset | None, ErrorCode]]


async def _offsets(
    ctx: RequestContext,
    group_id: str,
    member_id: str | None,
    member_epoch: int,
    wanted: list[tuple[str | None, Any, list[int]]] | None,
    by_id: bool,
    stable: bool,
) -> tuple[ErrorCode, list[tuple[str | None, Any, _Parts]]]:
    """(group error, [(topic name, topic key as requested, partitions)]) for a fetch.

    ``wanted`` None means every committed offset of the group; a name of None is an unknown
    topic id, answered UNKNOWN_TOPIC_ID. With ``stable``, a partition whose offset an open
    transaction may still commit is answered UNSTABLE_OFFSET_COMMIT (no offset), which clients
    retry until the transaction ends.
    """
    if not group_id:
        return ErrorCode.invalid_group_id, []
    if not ctx.allows(Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return ErrorCode.group_authorization_failed, []
    store = ctx.broker.groups.store
    try:
        stored = await store.load(group_id)
        group = stored.group if stored else None
        # KIP-848 members fetch with their epoch, so that a fenced member cannot read offsets
        # of partitions it no longer owns as if it did.
        if isinstance(group, ConsumerGroup) and member_id and member_epoch >= 0:
            error = consumer.commit_error(group, member_id, member_epoch)
            if error is not ErrorCode.none:
                return error, []
        # Pending offsets before committed ones: a transaction that ends in between has
        # applied its offsets before it stopped being pending, so this read sees them.
        pending = await ctx.broker.transactions.pending_offsets(group_id) if stable else set()
        if wanted is None:
            committed = await store.fetch_offsets(group_id)
            by_topic: dict[str, _Parts] = {}
            for (topic, p), offset in sorted(committed.items()):
                if _may_describe_topic(ctx, topic):  # others' offsets stay unseen, as in Kafka
                    by_topic.setdefault(topic, []).append(_answer(topic, p, offset, pending))
            out: list[tuple[str | None, Any, _Parts]] = []
            for topic, parts in by_topic.items():
                key: Any = topic
                if by_id:
                    known = await ctx.broker.topics.get(topic)
                    if known is None:
                        continue  # offsets of a deleted topic have no id to report under
                    key = known.topic_id
                out.append((topic, key, parts))
            return ErrorCode.none, out
        visible = {
            name for name, _, _ in wanted if name is not None and _may_describe_topic(ctx, name)
        }
        names = {name: parts for name, _, parts in wanted if name in visible}
        committed = await store.fetch_offsets(group_id, names)
    except IcefloeError as exc:
        return store_error(exc), []

    def fetched(name: str | None, p: int) -> tuple[int, CommittedOffset | None, ErrorCode]:
        if name is None:
            return p, None, ErrorCode.unknown_topic_id
        if name not in visible:
            return p, None, ErrorCode.topic_authorization_failed
        return _answer(name, p, committed.get((name, p)), pending)

    return ErrorCode.none, [
        (name, key, [fetched(name, p) for p in parts]) for name, key, parts in wanted
    ]


def _answer(
    topic: str, partition: int, offset: CommittedOffset | None, pending: set[tuple[str, int]]
) -> tuple[int, CommittedOffset | None, ErrorCode]:
    if (topic, partition) in pending:
        return partition, None, ErrorCode.unstable_offset_commit
    return partition, offset, ErrorCode.none


# --- OffsetDelete ---------------------------------------------------------------------------


async def handle_offset_delete(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    store = ctx.broker.groups.store
    group_id = request.group_id

    def answer(error: ErrorCode, codes: dict[tuple[str, int], ErrorCode] | None = None) -> Any:
        topics = tuple(
            make(
                module.OffsetDeleteResponseTopic,
                name=t.name,
                partitions=tuple(
                    make(
                        module.OffsetDeleteResponsePartition,
                        partition_index=p.partition_index,
                        error_code=(codes or {}).get((t.name, p.partition_index), ErrorCode.none),
                    )
                    for p in t.partitions
                ),
            )
            for t in (request.topics if codes is not None else ())
        )
        return make(
            module.OffsetDeleteResponse, error_code=error, throttle_time=_NO_THROTTLE, topics=topics
        )

    async def run() -> Any:
        if not ctx.allows(Operation.DELETE, ResourceType.GROUP, group_id):
            return answer(ErrorCode.group_authorization_failed)
        stored = await store.load(group_id) if group_id else None
        if stored is None:
            return answer(ErrorCode.group_id_not_found)
        subscribed = _subscribed_topics(stored.group)
        codes: dict[tuple[str, int], ErrorCode] = {}
        deletable = []
        for t in request.topics:
            readable = _may_read_topic(ctx, t.name)
            for p in t.partitions:
                tp = (t.name, int(p.partition_index))
                if not readable:
                    codes[tp] = ErrorCode.topic_authorization_failed
                elif t.name in subscribed:
                    codes[tp] = ErrorCode.group_subscribed_to_topic
                else:
                    codes[tp] = ErrorCode.none
                    deletable.append(tp)
        await store.delete_offsets(group_id, deletable)
        return answer(ErrorCode.none, codes)

    return await guarded(lambda code: answer(code), run())


def _may_read_topic(ctx: RequestContext, topic: str) -> bool:
    return ctx.allows(Operation.READ, ResourceType.TOPIC, topic)


def _may_describe_topic(ctx: RequestContext, topic: str) -> bool:
    return ctx.allows(Operation.DESCRIBE, ResourceType.TOPIC, topic)


def _subscribed_topics(group: Group) -> set[str]:
    """Topics whose offsets the group still uses: those its members subscribe to."""
    if isinstance(group, ConsumerGroup):
        return set(group.topics)
    if group.protocol_type != "consumer" or group.protocol_name is None:
        return set()
    protocol = group.protocol_name
    return {
        topic
        for m in group.members
        for topic in consumer_protocol.subscribed_topics(dict(m.protocols).get(protocol, b""))
    }
