"""Which partitions' offsets an open transaction may commit to a group, found from the group.

A transaction's offsets (TxnOffsetCommit) live in its own state until it commits; OffsetFetch
with ``require_stable`` must answer UNSTABLE_OFFSET_COMMIT for those partitions meanwhile, so
that a consumer taking them over waits for the outcome instead of reading offsets that are
about to change (KIP-447). Kafka's group coordinator keeps them in memory beside the group;
Icefloe keeps one key per group and transactional id,
``txn-pending-offsets/<group>/<transactional id>``, naming the transaction (producer id, epoch,
start time) and the partitions.

The coordinator writes a mark before the transaction's state holds the offsets, and deletes it
only once the transaction has ended, so the marks cover every pending offset at every moment.
A mark counts only while the transaction it names is still under way (:meth:`PendingMark.of`),
so one left by a broker that died, or written just after its transaction ended, misleads no
one; the coordinator's sweep deletes those.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import msgpack
from kio.schema.errors import ErrorCode

from icefloe.errors import ConflictError, CorruptDataError, KafkaError
from icefloe.keyspace import TXN_PENDING_OFFSETS, prefix_end
from icefloe.ports.metadata import MAX_KEY_BYTES, MAX_VALUE_BYTES, MetadataStore
from icefloe.transactions.state import Partition, TransactionState


@dataclass(frozen=True, slots=True)
class PendingMark:
    """A transaction that may commit offsets of ``partitions`` to a group."""

    transactional_id: str
    producer_id: int
    epoch: int
    started_ms: int
    partitions: frozenset[Partition]
    version: int = 0
    """The key's version as read (0: not read from the store)."""

    def of(self, state: TransactionState | None, group_id: str) -> bool:
        """Whether the mark belongs to ``state``'s transaction, still under way with the group."""
        return (
            state is not None
            and not state.status.idle
            and (state.producer_id, state.epoch, state.started_ms)
            == (self.producer_id, self.epoch, self.started_ms)
            and group_id in state.groups
        )

    def encode(self) -> bytes:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self.partitions):
            by_topic.setdefault(topic, []).append(partition)
        value = [self.producer_id, self.epoch, self.started_ms, by_topic]
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, transactional_id: str, value: bytes, version: int) -> PendingMark:
        try:
            producer_id, epoch, started_ms, by_topic = msgpack.unpackb(value, raw=False)
            partitions = frozenset(
                (str(topic), int(p)) for topic, ps in by_topic.items() for p in ps
            )
            return cls(
                transactional_id, int(producer_id), int(epoch), int(started_ms), partitions, version
            )
        except (ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(
                f"unreadable pending offsets of transactional id {transactional_id!r}: {exc}"
            ) from exc


class PendingOffsets:
    """The marks in the metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    async def mark(
        self, group_id: str, state: TransactionState, partitions: Iterable[Partition]
    ) -> None:
        """Record that ``state``'s transaction may commit offsets of ``partitions`` to the group,
        besides those it already marked there."""
        mark = PendingMark(
            state.transactional_id,
            state.producer_id,
            state.epoch,
            state.started_ms,
            frozenset(partitions),
        )
        key = _key(group_id, state.transactional_id)
        if key is None:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"group id {group_id[:40]!r}… and transactional id "
                f"{state.transactional_id[:40]!r}… are too long together: Icefloe keeps "
                f"pending offsets under a key of at most {MAX_KEY_BYTES} bytes",
            )
        record = await self._metadata.get(key)
        if record is not None:
            earlier = PendingMark.decode(state.transactional_id, record.value, record.version)
            if (earlier.producer_id, earlier.epoch, earlier.started_ms) == (
                mark.producer_id,
                mark.epoch,
                mark.started_ms,
            ):
                mark = PendingMark(
                    mark.transactional_id,
                    mark.producer_id,
                    mark.epoch,
                    mark.started_ms,
                    earlier.partitions | mark.partitions,
                )
        value = mark.encode()
        if len(value) > MAX_VALUE_BYTES:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"transaction {state.transactional_id!r} commits offsets of too many partitions "
                f"to group {group_id!r}",
            )
        # Unconditional: a sweep deleting a stale mark names the version it read, so it never
        # deletes this one.
        await self._metadata.put(key, value)

    async def marks(self, group_id: str) -> list[PendingMark]:
        """The group's marks, whether or not their transactions are still under way."""
        prefix = _group_prefix(group_id)
        if len(prefix.encode()) >= MAX_KEY_BYTES:
            return []  # no mark can have been written for so long a group id
        return [
            PendingMark.decode(_transactional_id(r.key), r.value, r.version)
            async for r in self._metadata.scan_all(prefix, prefix_end(prefix))
        ]

    async def every_mark(self) -> AsyncIterator[tuple[str, PendingMark]]:
        """(group id, mark) of every group's marks."""
        async for r in self._metadata.scan_all(
            TXN_PENDING_OFFSETS, prefix_end(TXN_PENDING_OFFSETS)
        ):
            group, _ = r.key.removeprefix(TXN_PENDING_OFFSETS).split("/", 1)
            yield (
                urllib.parse.unquote(group),
                PendingMark.decode(_transactional_id(r.key), r.value, r.version),
            )

    async def clear(self, group_id: str, mark: PendingMark) -> bool:
        """Delete ``mark`` if its key has not changed since it was read; whether it went."""
        key = _key(group_id, mark.transactional_id)
        assert key is not None  # it was read
        try:
            return await self._metadata.delete(key, expected_version=mark.version)
        except ConflictError:
            return False

    async def clear_transaction(self, group_id: str, state: TransactionState) -> None:
        """Delete the group's mark of ``state``'s transaction (whatever epoch fencing gave it
        since), and nothing newer."""
        key = _key(group_id, state.transactional_id)
        record = None if key is None else await self._metadata.get(key)
        if record is None:
            return
        mark = PendingMark.decode(state.transactional_id, record.value, record.version)
        if mark.started_ms == state.started_ms:
            await self.clear(group_id, mark)


def _group_prefix(group_id: str) -> str:
    return f"{TXN_PENDING_OFFSETS}{urllib.parse.quote(group_id, safe='')}/"


def _key(group_id: str, transactional_id: str) -> str | None:
    """The mark's key; ``None`` if the ids are too long together for a store key."""
    key = _group_prefix(group_id) + urllib.parse.quote(transactional_id, safe="")
    return key if len(key.encode()) <= MAX_KEY_BYTES else None


def _transactional_id(key: str) -> str:
    return urllib.parse.unquote(key.rsplit("/", 1)[1])
