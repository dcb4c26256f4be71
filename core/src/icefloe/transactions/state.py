"""A transactional id's state, as the coordinator keeps it in the metadata store.

The states are Kafka's (``TransactionState``): a producer with no transaction under way is
EMPTY (or COMPLETE_COMMIT / COMPLETE_ABORT after one); adding a partition or a group makes it
ONGOING; EndTxn or a timeout moves it to PREPARE_COMMIT / PREPARE_ABORT, the point of no return
once stored; writing the markers completes it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Final

import msgpack

from icefloe.errors import CorruptDataError

MAX_EPOCH: Final = 32766
"""Past this epoch a transactional producer is given a new producer id (Kafka's rule)."""

Partition = tuple[str, int]
PendingOffset = tuple[int, int, str | None]
"""(offset, leader epoch, metadata) of an offset committed in a transaction."""


@dataclass(frozen=True, slots=True)
class GroupMember:
    """The consumer group member a TxnOffsetCommit commits for (KIP-447; versions before 3
    name none)."""

    member_id: str = ""
    instance_id: str | None = None
    generation: int = -1
    """The classic group's generation, or the KIP-848 member's epoch."""


NO_MEMBER: Final = GroupMember()


class Status(enum.StrEnum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (Status.PREPARE_COMMIT, Status.PREPARE_ABORT)

    @property
    def idle(self) -> bool:
        """No transaction under way: a new one may begin."""
        return self in (Status.EMPTY, Status.COMPLETE_COMMIT, Status.COMPLETE_ABORT)


@dataclass(frozen=True)
class TransactionState:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    status: Status = Status.EMPTY
    partitions: dict[Partition, int] = field(default_factory=dict)
    """Each partition in the transaction, with its stream id."""
    groups: tuple[str, ...] = ()
    offsets: dict[str, dict[Partition, PendingOffset]] = field(default_factory=dict)
    """Offsets committed in the transaction, by group, applied when it commits."""
    started_ms: int = -1
    """When the transaction began (its first partition or group), for the timeout."""
    updated_ms: int = -1

    def begun(self, now_ms: int) -> TransactionState:
        """ONGOING, the start time set if the transaction begins now."""
        if self.status is Status.ONGOING:
            return self
        return replace(self, status=Status.ONGOING, started_ms=now_ms, updated_ms=now_ms)

    def completed(self, now_ms: int) -> TransactionState:
        done = (
            Status.COMPLETE_COMMIT
            if self.status is Status.PREPARE_COMMIT
            else Status.COMPLETE_ABORT
        )
        return replace(self, status=done, partitions={}, groups=(), offsets={}, updated_ms=now_ms)

    def timed_out(self, now_ms: int) -> bool:
        return self.status is Status.ONGOING and now_ms > self.started_ms + self.timeout_ms

    def encode(self) -> bytes:
        value = {
            "pid": self.producer_id,
            "epoch": self.epoch,
            "timeout": self.timeout_ms,
            "status": self.status.value,
            "partitions": [[t, p, s] for (t, p), s in self.partitions.items()],
            "groups": list(self.groups),
            "offsets": {
                group: [[t, p, *pending] for (t, p), pending in offsets.items()]
                for group, offsets in self.offsets.items()
            },
            "started": self.started_ms,
            "updated": self.updated_ms,
        }
        packed: bytes = msgpack.packb(value)
        return packed

    @classmethod
    def decode(cls, transactional_id: str, value: bytes) -> TransactionState:
        try:
            v = msgpack.unpackb(value)
            return cls(
                transactional_id,
                int(v["pid"]),
                int(v["epoch"]),
                int(v["timeout"]),
                Status(v["status"]),
                {(str(t), int(p)): int(s) for t, p, s in v["partitions"]},
                tuple(str(g) for g in v["groups"]),
                {
                    str(group): {
                        (str(t), int(p)): (int(o), int(e), None if m is None else str(m))
                        for t, p, o, e, m in offsets
                    }
                    for group, offsets in v["offsets"].items()
                },
                int(v["started"]),
                int(v["updated"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError, msgpack.UnpackException) as exc:
            raise CorruptDataError(
                f"unreadable state of transactional id {transactional_id!r}: {exc}"
            ) from exc
