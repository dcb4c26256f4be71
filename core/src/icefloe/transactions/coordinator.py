"""Kafka's transaction coordinator on leaderless brokers: any broker serves any transactional id.

Each transactional id's state (:class:`.state.TransactionState`) is one key in the metadata
store, changed by compare-and-set, so brokers never need to agree on an owner: FindCoordinator
names one (rendezvous hashing, for locality), but every broker answers correctly. What makes a
transaction safe without a leader:

- A partition joins the transaction's state first, then gets its open mark
  (:mod:`icefloe.storage.transactions`), and Produce takes the producer's records only once
  the mark exists: the partition's last stable offset holds back before any of its records
  exist, and finishing the transaction finds every mark through the state.
- PREPARE_COMMIT / PREPARE_ABORT is stored before any marker is written: from then on the
  outcome is decided, and any broker may finish it (EndTxn retried, InitProducerId of the next
  producer instance, or the sweeper that every broker runs).
- Finishing a partition writes its marker, then (on abort) records the aborted transaction,
  then clears the open mark. A partition whose mark is gone is finished, so finishing again
  skips it; two brokers finishing at once at worst write a marker twice, which readers ignore.
- Fencing: InitProducerId bumps the epoch (after aborting what the old instance left open), and
  Produce accepts a transactional batch only with the epoch of the partition's open mark.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import Final

from kio.schema.errors import ErrorCode

from icefloe.errors import ConflictError, IcefloeError, KafkaError, NotFoundError
from icefloe.groups import classic, consumer
from icefloe.groups.model import ClassicGroup, ConsumerGroup, Group
from icefloe.groups.store import CommittedOffset, GroupStore
from icefloe.keyspace import TRANSACTIONS, prefix_end
from icefloe.ports.metadata import MAX_VALUE_BYTES, MUST_NOT_EXIST, MetadataStore
from icefloe.storage.engine import StreamStorage
from icefloe.storage.transactions import ABORT, COMMIT, AbortedTransaction, OpenMark, control_batch
from icefloe.topics.registry import TopicRegistry
from icefloe.transactions.pending import PendingOffsets
from icefloe.transactions.state import (
    MAX_EPOCH,
    NO_MEMBER,
    GroupMember,
    Partition,
    PendingOffset,
    Status,
    TransactionState,
)

log = logging.getLogger(__name__)

MAX_TIMEOUT_MS: Final = 900_000
"""Kafka's ``transaction.max.timeout.ms``."""
MAX_PARTITIONS: Final = 10_000
"""Partitions one transaction may span (its state is one store value)."""
MAX_ID_LENGTH: Final = 512
SWEEP_INTERVAL_S: Final = 10.0
"""Kafka's ``transaction.abort.timed.out.transaction.cleanup.interval.ms``."""
EXPIRATION_MS: Final = 7 * 24 * 3600 * 1000
"""Kafka's ``transactional.id.expiration.ms``: an idle transactional id unused this long is
forgotten (its next producer gets a new producer id)."""
STUCK_AFTER_MS: Final = 10_000
"""A transaction prepared this long ago whose broker did not finish it is finished by others."""
_ATTEMPTS: Final = 50


class TransactionError(KafkaError):
    """A request the transaction's state refuses, with Kafka's error code."""


def now_ms() -> int:
    return int(time.time() * 1000)


def check_transactional_id(transactional_id: str) -> None:
    if not transactional_id or len(transactional_id) > MAX_ID_LENGTH:
        raise TransactionError(
            ErrorCode.invalid_request,
            f"a transactional id has 1 to {MAX_ID_LENGTH} characters",
        )


class TransactionCoordinator:
    def __init__(
        self,
        metadata: MetadataStore,
        storage: StreamStorage,
        topics: TopicRegistry,
        groups: GroupStore,
    ) -> None:
        self._metadata = metadata
        self._storage = storage
        self._marks = storage.transactions
        self._topics = topics
        self._groups = groups
        self._pending = PendingOffsets(metadata)
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="transaction-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    # --- the requests -----------------------------------------------------------------------

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, producer_id: int, epoch: int
    ) -> tuple[int, int]:
        """(producer id, epoch) for a producer instance taking the transactional id over: what
        an older instance left unfinished is aborted (or completed, if it was prepared to
        commit) and the epoch bumped, which fences that instance."""
        check_transactional_id(transactional_id)
        if not 0 < timeout_ms <= MAX_TIMEOUT_MS:
            raise TransactionError(
                ErrorCode.invalid_transaction_timeout,
                f"transaction.timeout.ms must be between 1 and {MAX_TIMEOUT_MS}, got {timeout_ms}",
            )
        for _ in range(_ATTEMPTS):
            stored = await self._load(transactional_id)
            if stored is None:
                fresh = TransactionState(
                    transactional_id,
                    await self._storage.allocate_producer_id(),
                    0,
                    timeout_ms,
                    updated_ms=now_ms(),
                )
                if await self._store(fresh, None) is not None:
                    return fresh.producer_id, fresh.epoch
                continue
            state, version = stored
            if producer_id >= 0 and (producer_id, epoch) != (state.producer_id, state.epoch):
                raise TransactionError(
                    ErrorCode.producer_fenced,
                    f"producer {producer_id} epoch {epoch} is not the current instance of "
                    f"{transactional_id!r}",
                )
            if not state.status.idle:
                await self._end_for_good(state, version)
                continue
            bumped = _bumped(state, await self._next_id_if_exhausted(state))
            if await self._store(replace(bumped, timeout_ms=timeout_ms), version) is not None:
                return bumped.producer_id, bumped.epoch
        raise _busy(transactional_id)

    async def add_partitions(
        self, transactional_id: str, producer_id: int, epoch: int, wanted: Iterable[Partition]
    ) -> dict[Partition, ErrorCode]:
        """Add partitions to the transaction; the error of each (all fail if one cannot)."""
        wanted = list(dict.fromkeys(wanted))
        streams: dict[Partition, int] = {}
        unknown = []
        for topic, partition in wanted:
            found = await self._topics.get(topic)
            if found is None or not 0 <= partition < found.partitions:
                unknown.append((topic, partition))
            else:
                streams[(topic, partition)] = found.streams[partition]
        if unknown:
            return {
                tp: ErrorCode.unknown_topic_or_partition
                if tp in unknown
                else ErrorCode.operation_not_attempted
                for tp in wanted
            }

        async def add(state: TransactionState) -> TransactionState:
            new = {tp: s for tp, s in streams.items() if tp not in state.partitions}
            if len(state.partitions) + len(new) > MAX_PARTITIONS:
                raise TransactionError(
                    ErrorCode.invalid_request,
                    f"a transaction spans at most {MAX_PARTITIONS} partitions",
                )
            begun = state.begun(now_ms())
            return replace(begun, partitions={**state.partitions, **new})

        await self._change(transactional_id, producer_id, epoch, add)
        # Then the open marks, which let the producer write: the state names every partition
        # that may have one, so finishing the transaction clears them all, whatever broker
        # died when. A retry writes the marks a dead broker did not.
        for stream_id in streams.values():
            mark = await self._marks.open_mark(stream_id, producer_id)
            if mark is None or mark.epoch != epoch:
                first = await self._storage.log_end(stream_id)
                if mark is not None:
                    first = min(first, mark.first_offset)
                opened = OpenMark(producer_id, epoch, first, transactional_id)
                await self._marks.mark_open(stream_id, opened)
        # A timeout or a new instance may have ended the transaction meanwhile, its finisher
        # not seeing these marks yet: take them back rather than leave them holding the LSO.
        stored = await self._load(transactional_id)
        current = None if stored is None else stored[0]
        if current is None or (current.producer_id, current.epoch, current.status) != (
            producer_id,
            epoch,
            Status.ONGOING,
        ):
            for stream_id in streams.values():
                mark = await self._marks.open_mark(stream_id, producer_id)
                if mark is not None and mark.epoch == epoch:
                    await self._marks.clear_open(stream_id, producer_id)
            raise TransactionError(
                ErrorCode.producer_fenced,
                f"the transaction of {transactional_id!r} ended while partitions were added",
            )
        return dict.fromkeys(wanted, ErrorCode.none)

    async def add_offsets(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str
    ) -> None:
        async def add(state: TransactionState) -> TransactionState:
            begun = state.begun(now_ms())
            if group_id in begun.groups:
                return begun
            return replace(begun, groups=(*begun.groups, group_id))

        await self._change(transactional_id, producer_id, epoch, add)

    async def commit_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        group_id: str,
        offsets: dict[Partition, PendingOffset],
        member: GroupMember = NO_MEMBER,
    ) -> None:
        """Offsets a consumer group will have once the transaction commits (TxnOffsetCommit),
        if the group still counts ``member`` in (KIP-447).

        The partitions are marked pending for the group before the state holds their offsets,
        and the member is checked again in between: a rebalance that gave the partitions to
        another member before the mark was written is seen then and refuses the commit, and a
        new owner that reads the group's offsets after it finds them pending
        (UNSTABLE_OFFSET_COMMIT) until the transaction ends. Either way no member reads offsets
        that this commit changes later.
        """
        state, _ = await self._require(transactional_id, producer_id, epoch)
        _check_offsets_allowed(state, group_id)
        await self._check_member(group_id, member)
        await self._pending.mark(group_id, state, offsets)
        await self._check_member(group_id, member)

        async def add(state: TransactionState) -> TransactionState:
            _check_offsets_allowed(state, group_id)
            pending = {**state.offsets.get(group_id, {}), **offsets}
            return replace(state, offsets={**state.offsets, group_id: pending})

        await self._change(transactional_id, producer_id, epoch, add)

    async def pending_offsets(self, group_id: str) -> set[Partition]:
        """Partitions whose offsets a transaction still under way may commit to the group."""
        pending: set[Partition] = set()
        for mark in await self._pending.marks(group_id):
            stored = await self._load(mark.transactional_id)
            if mark.of(None if stored is None else stored[0], group_id):
                pending |= mark.partitions
        return pending

    async def _group_if_absent(self, group_id: str) -> None:
        """An empty classic group for offsets committed without one, as Kafka makes (a
        "simple" group, which ListGroups shows)."""

        def create(group: Group | None, now: int) -> tuple[Group | None, None]:
            return (ClassicGroup(group_id) if group is None else None), None

        await self._groups.update(group_id, create)

    async def _check_member(self, group_id: str, member: GroupMember) -> None:
        stored = await self._groups.load(group_id)
        group = None if stored is None else stored.group
        if isinstance(group, ConsumerGroup):
            code = consumer.txn_commit_error(
                group, member.member_id, member.instance_id, member.generation
            )
        else:
            code = classic.txn_commit_error(
                group, member.member_id, member.instance_id, member.generation
            )
        if code is not ErrorCode.none:
            raise TransactionError(
                code,
                f"group {group_id!r} takes no offsets from member {member.member_id!r} "
                f"(instance {member.instance_id!r}, generation {member.generation})",
            )

    async def end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> None:
        """Commit or abort the transaction; returns once every marker is written."""
        wanted = Status.PREPARE_COMMIT if commit else Status.PREPARE_ABORT
        done = Status.COMPLETE_COMMIT if commit else Status.COMPLETE_ABORT
        for _ in range(_ATTEMPTS):
            state, version = await self._require(transactional_id, producer_id, epoch)
            if state.status is done or state.status is Status.EMPTY:
                return  # a retry of an EndTxn that completed, or nothing to end
            if state.status is Status.COMPLETE_COMMIT and not commit:
                # The last transaction committed (its EndTxn was decided by a broker that died
                # before answering, say): answering this abort as done would have the client
                # read its records again. Kafka answers INVALID_TXN_STATE.
                raise _state_error(state, "abort a committed transaction")
            if state.status.preparing:
                if state.status is not wanted:
                    raise _state_error(state, "end it the other way")
                await self._finish(state, version)
                return
            if state.status is not Status.ONGOING:
                raise _state_error(state, "commit or abort")
            prepared = replace(state, status=wanted, updated_ms=now_ms())
            stored = await self._store(prepared, version)
            if stored is not None:
                await self._finish(prepared, stored)
                return
        raise _busy(transactional_id)

    async def describe(self, transactional_id: str) -> TransactionState | None:
        stored = await self._load(transactional_id)
        return None if stored is None else stored[0]

    async def list(self) -> list[TransactionState]:
        found = []
        async for record in self._metadata.scan_all(TRANSACTIONS, prefix_end(TRANSACTIONS)):
            name = urllib.parse.unquote(record.key.removeprefix(TRANSACTIONS))
            try:
                found.append(TransactionState.decode(name, record.value))
            except IcefloeError as exc:
                log.warning("skipping transaction %r: %s", name, exc)
        return found

    # --- finishing --------------------------------------------------------------------------

    async def _end_for_good(self, state: TransactionState, version: int) -> None:
        """Finish what an instance left: complete a prepared transaction, abort an ongoing one
        (with the epoch bumped, so the instance cannot write on)."""
        if state.status is Status.ONGOING:
            fenced = replace(
                _bumped(state, state.producer_id),
                status=Status.PREPARE_ABORT,
                updated_ms=now_ms(),
            )
            stored = await self._store(fenced, version)
            if stored is None:
                return  # changed meanwhile: the caller looks again
            state, version = fenced, stored
        await self._finish(state, version)

    async def _finish(self, state: TransactionState, version: int) -> None:
        """Write the markers of a prepared transaction and complete it."""
        commit = state.status is Status.PREPARE_COMMIT
        await asyncio.gather(
            *(
                self._finish_partition(state, stream_id, commit)
                for stream_id in set(state.partitions.values())
            )
        )
        if commit:
            for group_id, offsets in state.offsets.items():
                await self._group_if_absent(group_id)
                when = now_ms()
                await self._groups.commit_offsets(
                    group_id,
                    {tp: CommittedOffset(o, e, m, when) for tp, (o, e, m) in offsets.items()},
                    None,
                )
        # Only now are the offsets stable: a fetch that no longer finds them pending reads them.
        for group_id in state.groups:
            await self._pending.clear_transaction(group_id, state)
        completed = state.completed(now_ms())
        # Lost to another broker completing it (or the next instance moving on): fine either way.
        await self._store(completed, version)

    async def _finish_partition(
        self, state: TransactionState, stream_id: int, commit: bool
    ) -> None:
        mark = await self._marks.open_mark(stream_id, state.producer_id)
        if mark is None:
            return  # finished already
        batch = control_batch(state.producer_id, state.epoch, COMMIT if commit else ABORT)
        try:
            marker_offset = await self._storage.append_control(stream_id, batch)
        except NotFoundError:
            marker_offset = None  # the topic was deleted meanwhile: nothing left to mark
        if marker_offset is not None and not commit:
            aborted = AbortedTransaction(state.producer_id, mark.first_offset, marker_offset)
            await self._marks.record_abort(stream_id, aborted)
        await self._marks.clear_open(stream_id, state.producer_id)

    # --- the sweeper ------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Abort transactions past their timeout, finish prepared ones that were left, and
        forget transactional ids idle past their expiration; return how many were acted on.
        Every broker sweeps; compare-and-set keeps it safe."""
        acted = 0
        now = now_ms()
        for state in await self.list():
            if state.status.idle and now - state.updated_ms > EXPIRATION_MS:
                acted += await self._forget(state)
                continue
            stuck = state.status.preparing and now - state.updated_ms > STUCK_AFTER_MS
            if not (state.timed_out(now) or stuck):
                continue
            stored = await self._load(state.transactional_id)
            if stored is None:
                continue
            current, version = stored
            left = current.status.preparing and now - current.updated_ms > STUCK_AFTER_MS
            if current.timed_out(now) or left:
                log.info(
                    "%s transaction %r of producer %d",
                    "aborting timed-out" if current.timed_out(now) else "finishing",
                    current.transactional_id,
                    current.producer_id,
                )
                await self._end_for_good(current, version)
                acted += 1
        return acted + await self._sweep_pending_offsets()

    async def _sweep_pending_offsets(self) -> int:
        """Delete the pending-offset marks of transactions that ended without deleting them
        (their broker died first, or a late TxnOffsetCommit wrote one after the end)."""
        cleared = 0
        async for group_id, mark in self._pending.every_mark():
            stored = await self._load(mark.transactional_id)
            if not mark.of(None if stored is None else stored[0], group_id):
                cleared += await self._pending.clear(group_id, mark)
        return cleared

    async def _forget(self, state: TransactionState) -> int:
        stored = await self._load(state.transactional_id)
        if stored is None or stored[0] != state:
            return 0  # used again meanwhile
        try:
            await self._metadata.delete(_key(state.transactional_id), expected_version=stored[1])
        except ConflictError:
            return 0
        return 1

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S * random.uniform(0.5, 1.5))
            try:
                await self.sweep()
            except IcefloeError:
                log.warning("transaction sweep failed; will retry", exc_info=True)

    # --- state in the store -----------------------------------------------------------------

    async def _change(
        self,
        transactional_id: str,
        producer_id: int,
        epoch: int,
        change: Callable[[TransactionState], Awaitable[TransactionState]],
    ) -> TransactionState:
        for _ in range(_ATTEMPTS):
            state, version = await self._require(transactional_id, producer_id, epoch)
            if state.status.preparing:
                raise TransactionError(
                    ErrorCode.concurrent_transactions,
                    f"the previous transaction of {transactional_id!r} is still being finished",
                )
            changed = await change(state)
            if changed == state:
                return changed
            if await self._store(replace(changed, updated_ms=now_ms()), version) is not None:
                return changed
        raise _busy(transactional_id)

    async def _require(
        self, transactional_id: str, producer_id: int, epoch: int
    ) -> tuple[TransactionState, int]:
        """The state, if ``producer_id`` at ``epoch`` is its current instance."""
        check_transactional_id(transactional_id)
        stored = await self._load(transactional_id)
        if stored is None:
            raise TransactionError(
                ErrorCode.invalid_producer_id_mapping,
                f"no producer id is known for transactional id {transactional_id!r}: "
                "call InitProducerId first",
            )
        state, version = stored
        if producer_id != state.producer_id:
            raise TransactionError(
                ErrorCode.invalid_producer_id_mapping,
                f"producer {producer_id} does not hold transactional id {transactional_id!r}",
            )
        if epoch != state.epoch:
            raise TransactionError(
                ErrorCode.producer_fenced,
                f"producer epoch {epoch} of {transactional_id!r} was fenced by epoch {state.epoch}",
            )
        return state, version

    async def _load(self, transactional_id: str) -> tuple[TransactionState, int] | None:
        record = await self._metadata.get(_key(transactional_id))
        if record is None:
            return None
        return TransactionState.decode(transactional_id, record.value), record.version

    async def _store(self, state: TransactionState, version: int | None) -> int | None:
        """Write ``state`` if the stored version is still ``version`` (``None``: absent);
        the new version, or ``None`` if another write came first."""
        value = state.encode()
        if len(value) > MAX_VALUE_BYTES:
            raise TransactionError(
                ErrorCode.invalid_request,
                f"transaction {state.transactional_id!r} would hold too many partitions or "
                f"offsets ({len(value)} bytes of state; at most {MAX_VALUE_BYTES})",
            )
        try:
            record = await self._metadata.put(
                _key(state.transactional_id),
                value,
                expected_version=MUST_NOT_EXIST if version is None else version,
            )
        except ConflictError:
            return None
        return record.version

    async def _next_id_if_exhausted(self, state: TransactionState) -> int:
        if state.epoch + 1 <= MAX_EPOCH:
            return state.producer_id
        return await self._storage.allocate_producer_id()


def _check_offsets_allowed(state: TransactionState, group_id: str) -> None:
    if state.status.preparing:
        raise TransactionError(
            ErrorCode.concurrent_transactions,
            f"the previous transaction of {state.transactional_id!r} is still being finished",
        )
    if group_id not in state.groups:
        raise TransactionError(
            ErrorCode.invalid_txn_state,
            f"group {group_id!r} was not added to the transaction (AddOffsetsToTxn)",
        )


def _bumped(state: TransactionState, producer_id: int) -> TransactionState:
    if producer_id != state.producer_id:
        return replace(state, producer_id=producer_id, epoch=0)
    return replace(state, epoch=state.epoch + 1)


def _key(transactional_id: str) -> str:
    return TRANSACTIONS + urllib.parse.quote(transactional_id, safe="")


def _state_error(state: TransactionState, what: str) -> TransactionError:
    return TransactionError(
        ErrorCode.invalid_txn_state,
        f"cannot {what}: transaction {state.transactional_id!r} is {state.status.value}",
    )


def _busy(transactional_id: str) -> TransactionError:
    return TransactionError(
        ErrorCode.concurrent_transactions,
        f"transactional id {transactional_id!r} kept changing; retry",
    )
