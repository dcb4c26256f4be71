"""The transaction APIs: AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit, EndTxn,
DescribeTransactions and ListTransactions, answered by :mod:`icefloe.transactions.coordinator`
on whichever broker the client reaches (InitProducerId and FindCoordinator, which transactions
share with idempotent producers and groups, live with those).

TxnOffsetCommit (v3+) names the consumer group member the offsets come from, and the group
refuses a member a rebalance left behind (KIP-447), as Kafka's group coordinator does.

AddPartitionsToTxn is served in its client versions (0–3): from v4 on it is the brokers'
verification call of KIP-890, which Icefloe's produce path does not need (Produce checks the
partition's open transaction itself). ListTransactions is served up to v1: v2's transactional
id pattern is a regular expression from the client, which a backtracking engine cannot run
safely on the event loop.
"""

from __future__ import annotations

import datetime
from collections.abc import Awaitable
from typing import Any, TypeVar

from kio.schema.errors import ErrorCode

from icefloe.broker.handlers.groups import store_error
from icefloe.broker.protocol import make
from icefloe.broker.server import RequestContext
from icefloe.errors import IcefloeError, KafkaError
from icefloe.security.acls import Operation, ResourceType
from icefloe.transactions.state import GroupMember, PendingOffset, Status

_NO_THROTTLE = datetime.timedelta(0)
T = TypeVar("T")


def may_write(ctx: RequestContext, transactional_id: str) -> bool:
    return ctx.allows(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id)


async def outcome(work: Awaitable[T]) -> tuple[ErrorCode, T | None]:
    """(error, result) of a coordinator call: Kafka errors as they are, store failures as
    COORDINATOR_NOT_AVAILABLE (retried by clients) or UNKNOWN_SERVER_ERROR."""
    try:
        return ErrorCode.none, await work
    except KafkaError as exc:
        return exc.error_code, None
    except IcefloeError as exc:
        return store_error(exc), None


async def handle_add_partitions_to_txn(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    transactional_id = request.v3_and_below_transactional_id
    wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    if not may_write(ctx, transactional_id):
        errors = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
    else:
        denied = {t for t, _ in wanted if not ctx.allows(Operation.WRITE, ResourceType.TOPIC, t)}
        if denied:
            errors = {
                (t, p): ErrorCode.topic_authorization_failed
                if t in denied
                else ErrorCode.operation_not_attempted
                for t, p in wanted
            }
        else:
            code, added = await outcome(
                ctx.broker.transactions.add_partitions(
                    transactional_id,
                    request.v3_and_below_producer_id,
                    request.v3_and_below_producer_epoch,
                    wanted,
                )
            )
            errors = added if added is not None else dict.fromkeys(wanted, code)
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), error in errors.items():
        by_topic.setdefault(topic, []).append(
            make(
                module.AddPartitionsToTxnPartitionResult,
                partition_index=partition,
                partition_error_code=error,
            )
        )
    return make(
        module.AddPartitionsToTxnResponse,
        throttle_time=_NO_THROTTLE,
        results_by_topic_v3_and_below=tuple(
            make(module.AddPartitionsToTxnTopicResult, name=topic, results_by_partition=tuple(rs))
            for topic, rs in by_topic.items()
        ),
    )


async def handle_add_offsets_to_txn(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    if not may_write(ctx, request.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    elif not ctx.allows(Operation.READ, ResourceType.GROUP, request.group_id):
        code = ErrorCode.group_authorization_failed
    else:
        code, _ = await outcome(
            ctx.broker.transactions.add_offsets(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.group_id,
            )
        )
    return make(module.AddOffsetsToTxnResponse, throttle_time=_NO_THROTTLE, error_code=code)


async def handle_txn_offset_commit(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    wanted: dict[tuple[str, int], PendingOffset] = {
        (t.name, int(p.partition_index)): (
            int(p.committed_offset),
            int(getattr(p, "committed_leader_epoch", -1)),
            p.committed_metadata,
        )
        for t in request.topics
        for p in t.partitions
    }
    # v3+ names the consumer group member the offsets come from (KIP-447); earlier versions
    # name none, which the group accepts as it would a producer outside the group.
    member = GroupMember(
        getattr(request, "member_id", ""),
        getattr(request, "group_instance_id", None),
        int(getattr(request, "generation_id", -1)),
    )
    if not may_write(ctx, request.transactional_id):
        errors = dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
    elif not ctx.allows(Operation.READ, ResourceType.GROUP, request.group_id):
        errors = dict.fromkeys(wanted, ErrorCode.group_authorization_failed)
    elif not request.group_id:
        errors = dict.fromkeys(wanted, ErrorCode.invalid_group_id)
    else:
        code, checked = await outcome(_partition_errors(ctx, wanted))
        errors = checked if checked is not None else dict.fromkeys(wanted, code)
        accepted = {tp: o for tp, o in wanted.items() if errors[tp] is ErrorCode.none}
        if accepted:
            code, _ = await outcome(
                ctx.broker.transactions.commit_offsets(
                    request.transactional_id,
                    request.producer_id,
                    request.producer_epoch,
                    request.group_id,
                    accepted,
                    member,
                )
            )
            errors.update(dict.fromkeys(accepted, code))
    by_topic: dict[str, list[Any]] = {}
    for (topic, partition), error in errors.items():
        by_topic.setdefault(topic, []).append(
            make(
                module.TxnOffsetCommitResponsePartition, partition_index=partition, error_code=error
            )
        )
    return make(
        module.TxnOffsetCommitResponse,
        throttle_time=_NO_THROTTLE,
        topics=tuple(
            make(module.TxnOffsetCommitResponseTopic, name=topic, partitions=tuple(parts))
            for topic, parts in by_topic.items()
        ),
    )


async def _partition_errors(
    ctx: RequestContext, wanted: dict[tuple[str, int], PendingOffset]
) -> dict[tuple[str, int], ErrorCode]:
    """What each partition's offset is refused for before the group is asked, as Kafka does."""
    max_metadata = ctx.broker.groups.options.offset_metadata_max_bytes
    errors = {}
    for (topic, partition), (_, _, metadata) in wanted.items():
        if not ctx.allows(Operation.READ, ResourceType.TOPIC, topic):
            errors[(topic, partition)] = ErrorCode.topic_authorization_failed
            continue
        found = await ctx.broker.topics.get(topic)
        if found is None or not 0 <= partition < found.partitions:
            errors[(topic, partition)] = ErrorCode.unknown_topic_or_partition
        elif metadata is not None and len(metadata.encode()) > max_metadata:
            errors[(topic, partition)] = ErrorCode.offset_metadata_too_large
        else:
            errors[(topic, partition)] = ErrorCode.none
    return errors


async def handle_end_txn(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    if not may_write(ctx, request.transactional_id):
        code = ErrorCode.transactional_id_authorization_failed
    else:
        code, _ = await outcome(
            ctx.broker.transactions.end(
                request.transactional_id,
                request.producer_id,
                request.producer_epoch,
                request.committed,
            )
        )
    return make(module.EndTxnResponse, throttle_time=_NO_THROTTLE, error_code=code)


async def handle_describe_transactions(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    described = []
    for transactional_id in dict.fromkeys(request.transactional_ids):

        def answer(code: ErrorCode, **fields: Any) -> Any:
            values = {
                "transaction_state": "",
                "transaction_timeout": _NO_THROTTLE,
                "transaction_start_time": datetime.datetime.fromtimestamp(0, datetime.UTC),
                "producer_id": -1,
                "producer_epoch": -1,
                "topics": (),
                **fields,
            }
            return make(
                module.TransactionState,
                error_code=code,
                transactional_id=transactional_id,  # noqa: B023 - used at once
                **values,
            )

        if not ctx.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            described.append(answer(ErrorCode.transactional_id_authorization_failed))
            continue
        code, state = await outcome(ctx.broker.transactions.describe(transactional_id))
        if code is not ErrorCode.none:
            described.append(answer(code))
        elif state is None:
            described.append(answer(ErrorCode.transactional_id_not_found))
        else:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(state.partitions):
                by_topic.setdefault(topic, []).append(partition)
            started = state.started_ms if state.status is Status.ONGOING else -1
            described.append(
                answer(
                    ErrorCode.none,
                    transaction_state=state.status.value,
                    transaction_timeout=datetime.timedelta(milliseconds=state.timeout_ms),
                    transaction_start_time=datetime.datetime.fromtimestamp(
                        started / 1000, datetime.UTC
                    ),
                    producer_id=state.producer_id,
                    producer_epoch=state.epoch,
                    topics=tuple(
                        make(module.TopicData, topic=t, partitions=tuple(ps))
                        for t, ps in by_topic.items()
                    ),
                )
            )
    return make(
        module.DescribeTransactionsResponse,
        throttle_time=_NO_THROTTLE,
        transaction_states=tuple(described),
    )


async def handle_list_transactions(ctx: RequestContext, request: Any) -> Any:
    module = ctx.response_module()
    known = {s.value for s in Status}
    wanted_states = set(request.state_filters)
    producers = set(request.producer_id_filters)
    min_age_ms = int(getattr(request, "duration_filter", -1))
    code, states = await outcome(ctx.broker.transactions.list())
    now_ms = int(datetime.datetime.now(datetime.UTC).timestamp() * 1000)
    listed = [
        make(
            module.TransactionState,
            transactional_id=s.transactional_id,
            producer_id=s.producer_id,
            transaction_state=s.status.value,
        )
        for s in states or []
        if (not wanted_states or s.status.value in wanted_states)
        and (not producers or s.producer_id in producers)
        and (min_age_ms < 0 or (s.status is Status.ONGOING and now_ms - s.started_ms >= min_age_ms))
        and ctx.allows(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, s.transactional_id)
    ]
    return make(
        module.ListTransactionsResponse,
        throttle_time=_NO_THROTTLE,
        error_code=code,
        unknown_state_filters=tuple(sorted(wanted_states - known)),
        transaction_states=tuple(listed),
    )
