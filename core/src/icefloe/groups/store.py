"""Group records and committed offsets in the metadata store: the only I/O of group state.

Every change of a group record is a compare-and-set: read the record and its version, let a
pure function decide (:mod:`.classic`, :mod:`.consumer`), write with the version read, and on a
conflict decide again from the new record. Any broker can therefore serve any group request.

Times are wall-clock milliseconds, because deadlines written by one broker are enforced by
another: brokers' clocks must agree to well within a session timeout (NTP does).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import msgpack

from icefloe.errors import ConflictError, CorruptDataError
from icefloe.groups import keys
from icefloe.groups.model import Group, decode, encode
from icefloe.keyspace import prefix_end
from icefloe.ports.metadata import MUST_NOT_EXIST, Check, MetadataStore, Put, Record

R = TypeVar("R")


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Stored:
    """A group record as read, with the version a compare-and-set must name."""

    group: Group
    version: int


@dataclass(frozen=True, slots=True)
class Decision(Generic[R]):
    """What :meth:`GroupStore.update` did: the decision's result and the record after it."""

    result: R
    stored: Stored | None
    changed: bool


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_time_ms: int

    def encode(self) -> bytes:
        value = [self.offset, self.leader_epoch, self.metadata, self.commit_time_ms]
        return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]

    @classmethod
    def decode(cls, value: bytes) -> CommittedOffset:
        offset, leader_epoch, metadata, commit_time_ms = msgpack.unpackb(value, raw=False)
        return cls(offset, leader_epoch, metadata, commit_time_ms)


TopicPartition = tuple[str, int]


class GroupStore:
    """Reads and compare-and-set writes of group records, liveness and offsets."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata
        # With multi-key transactions an offset commit is checked against the group record
        # atomically; without, a commit validated just before a rebalance may still land.
        self._transactions = metadata.supports(MetadataStore.MULTI_KEY_TRANSACTION)

    # --- group records --------------------------------------------------------------------

    async def load(self, group_id: str) -> Stored | None:
        return _stored(await self._metadata.get(keys.group(group_id)))

    async def update(
        self, group_id: str, decide: Callable[[Group | None, int], tuple[Group | None, R]]
    ) -> Decision[R]:
        """Apply ``decide(current, now)`` by compare-and-set until it sticks.

        ``decide`` returns the record to write (``None``: leave it) and a result; it may run
        several times, so it must be pure.
        """
        while True:
            stored = await self.load(group_id)
            new, result = decide(stored.group if stored else None, now_ms())
            if new is None:
                return Decision(result, stored, changed=False)
            expected = stored.version if stored else MUST_NOT_EXIST
            try:
                record = await self._metadata.put(
                    keys.group(group_id), encode(new), expected_version=expected
                )
            except ConflictError:
                continue
            return Decision(result, Stored(new, record.version), changed=True)

    async def delete(self, group_id: str, stored: Stored) -> bool:
        """Delete the record and everything of the group; ``False`` if it changed meanwhile."""
        try:
            await self._metadata.delete(keys.group(group_id), expected_version=stored.version)
        except ConflictError:
            return False
        await self.delete_offsets(group_id)
        prefix = keys.alive_prefix(group_id)
        await self._metadata.delete_range(prefix, prefix_end(prefix))
        return True

    async def list(self) -> list[Stored]:
        records = await self._metadata.scan(keys.GROUPS, prefix_end(keys.GROUPS))
        out = []
        for record in records:
            with contextlib.suppress(CorruptDataError):
                stored = _stored(record)
                if stored is not None:
                    out.append(stored)
        return out

    # --- liveness -------------------------------------------------------------------------

    async def touch(self, group_id: str, member_id: str) -> None:
        """Record that a member was heard from: a blind write that never conflicts."""
        value = msgpack.packb(now_ms())
        await self._metadata.put(keys.alive(group_id, member_id), value)

    async def liveness(self, group_id: str) -> dict[str, int]:
        """When each member was last heard from, by member id."""
        prefix = keys.alive_prefix(group_id)
        records = await self._metadata.scan(prefix, prefix_end(prefix))
        return {keys.unescape(r.key[len(prefix) :]): msgpack.unpackb(r.value) for r in records}

    async def forget(self, group_id: str, member_ids: Iterable[str]) -> None:
        for member_id in member_ids:
            await self._metadata.delete(keys.alive(group_id, member_id))

    # --- offsets --------------------------------------------------------------------------

    async def commit_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition, CommittedOffset],
        guard: Stored | None,
    ) -> None:
        """Store offsets; with ``guard``, only if the group record still has that version.

        Raises:
            ConflictError: the group record changed since ``guard`` was read (transactions
                only): validate against the new record and try again.
        """
        writes = [Put(keys.offset(group_id, t, p), o.encode()) for (t, p), o in offsets.items()]
        if self._transactions and guard is not None:
            await self._metadata.transact([Check(keys.group(group_id), guard.version)], writes)
            return
        for write in writes:
            await self._metadata.put(write.key, write.value)

    async def fetch_offsets(
        self, group_id: str, topics: Mapping[str, Iterable[int]] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of the given partitions (of every partition if ``topics`` is None)."""
        prefixes = (
            [keys.offsets_prefix(group_id)]
            if topics is None
            else [keys.offsets_prefix(group_id, t) for t in topics]
        )
        out: dict[TopicPartition, CommittedOffset] = {}
        for prefix in prefixes:
            for record in await self._metadata.scan(prefix, prefix_end(prefix)):
                out[keys.parse_offset(record.key)] = CommittedOffset.decode(record.value)
        if topics is not None:
            wanted = {(t, p) for t, ps in topics.items() for p in ps}
            out = {tp: o for tp, o in out.items() if tp in wanted}
        return out

    async def delete_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> None:
        if partitions is None:
            prefix = keys.offsets_prefix(group_id)
            await self._metadata.delete_range(prefix, prefix_end(prefix))
            return
        for topic, partition in partitions:
            await self._metadata.delete(keys.offset(group_id, topic, partition))


def _stored(record: Record | None) -> Stored | None:
    return None if record is None else Stored(decode(record.value), record.version)
