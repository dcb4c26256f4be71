"""What a Kafka consumer may read from a partition written by transactional and plain producers
while compaction and log compaction run: a model of the log, and the check of one read.

A ``read_committed`` consumer sees, in offset order, every record of a committed transaction
and every plain record below the last stable offset; a ``read_uncommitted`` one sees every
record below the log end. Either may miss only what Kafka's rules let go:

- records of aborted transactions (read_committed never sees them; read_uncommitted may, until
  compaction leaves them out);
- on a topic whose ``cleanup.policy`` has ``compact``, a record that a later record of the
  same key replaced, once a cleaning ran that could see that later record (it was written,
  and decided if transactional, before the cleaning ended: the cleaner only reads data
  files, which hold decided records only), and a tombstone (null value) once a cleaning ran
  more than ``delete.retention.ms`` after its timestamp.

Nothing else may be missing, and nothing may be seen that was not written at that offset.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

READ_COMMITTED = "read_committed"
READ_UNCOMMITTED = "read_uncommitted"

Seen = tuple[int, bytes | None, bytes | None]
"""(offset, key, value) of a record a consumer returned."""


class Outcome(Enum):
    OPEN = "open"
    COMMITTED = "committed"
    ABORTED = "aborted"


@dataclass(eq=False)
class Transaction:
    name: str
    outcome: Outcome = Outcome.OPEN
    decided_at: int | None = None
    """The model's clock when it committed or aborted."""
    first_log_end: dict[str, int] = field(default_factory=dict)
    """Per partition, the log end before the transaction's first record there: its open mark."""


@dataclass(frozen=True)
class Written:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    transaction: Transaction | None
    written_at: int


@dataclass(frozen=True)
class Cleaning:
    """A log-compaction pass of a partition (or the possibility of one), as of its end."""

    at: int
    """The model's clock when it ended."""
    wall_ms: int
    """Wall-clock time at its end: a cleaning's horizon is never later."""
    log_end: int


@dataclass
class Partition:
    name: str
    compacted: bool
    delete_retention_ms: int
    records: dict[int, Written] = field(default_factory=dict)
    log_end: int = 0
    cleanings: list[Cleaning] = field(default_factory=list)
    transactions: list[Transaction] = field(default_factory=list)
    """Transactions that wrote here."""

    def stable_offset(self) -> int:
        """The last stable offset: the open mark of the oldest open transaction, or the log end."""
        open_marks = (
            t.first_log_end[self.name]
            for t in self.transactions
            if t.outcome is Outcome.OPEN and self.name in t.first_log_end
        )
        return min(open_marks, default=self.log_end)


class Model:
    """Partitions, the transactions writing to them, and the cleanings that ran."""

    def __init__(self) -> None:
        self.clock = 0
        self.partitions: dict[str, Partition] = {}

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def add_partition(
        self, name: str, *, compacted: bool, delete_retention_ms: int = 86_400_000
    ) -> Partition:
        partition = Partition(name, compacted, delete_retention_ms)
        self.partitions[name] = partition
        return partition

    def will_write(self, partition: str, transaction: Transaction | None) -> None:
        """Before a transaction's first record in ``partition`` is sent: note its open mark."""
        p = self.partitions[partition]
        if transaction is not None and partition not in transaction.first_log_end:
            transaction.first_log_end[partition] = p.log_end
            p.transactions.append(transaction)

    def written(
        self,
        partition: str,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int,
        transaction: Transaction | None,
    ) -> None:
        p = self.partitions[partition]
        assert offset not in p.records, f"{partition}: offset {offset} written twice"
        p.records[offset] = Written(offset, key, value, timestamp_ms, transaction, self.tick())
        p.log_end = max(p.log_end, offset + 1)

    def decided(self, transaction: Transaction, outcome: Outcome) -> None:
        """The transaction ended: its marker took an offset in each partition it wrote."""
        transaction.outcome = outcome
        transaction.decided_at = self.tick()
        for name in transaction.first_log_end:
            self.partitions[name].log_end += 1

    def cleaned(self, partition: str, wall_ms: int) -> None:
        """A cleaning of ``partition`` ended (or may have, before a read ended)."""
        p = self.partitions[partition]
        p.cleanings.append(Cleaning(self.tick(), wall_ms, p.log_end))

    def check(
        self,
        partition: str,
        isolation: str,
        start: int,
        end: int,
        seen: Sequence[Seen],
    ) -> list[str]:
        """What is wrong with a read of ``partition`` from ``start`` that returned ``seen`` and
        ended at position ``end``: a list of problems, empty if none."""
        p = self.partitions[partition]
        committed = isolation == READ_COMMITTED
        wanted_end = p.stable_offset() if committed else p.log_end
        problems = []
        if end != wanted_end:
            problems.append(f"the read ended at {end}, not at {wanted_end}")
        offsets = [offset for offset, _, _ in seen]
        if offsets != sorted(set(offsets)):
            problems.append(f"offsets not strictly increasing: {offsets}")
        for offset, key, value in seen:
            record = p.records.get(offset)
            if record is None:
                problems.append(f"offset {offset} holds no record (a marker, or nothing)")
            elif (record.key, record.value) != (key, value):
                problems.append(
                    f"offset {offset}: read {key!r}={value!r}, written {record.key!r}="
                    f"{record.value!r}"
                )
            elif committed and _undecided_or_aborted(record):
                outcome = record.transaction.outcome.value if record.transaction else ""
                problems.append(f"offset {offset}: a record of an {outcome} transaction")
            if not start <= offset < end:
                problems.append(f"offset {offset} outside the read [{start}, {end})")
        got = set(offsets)
        for offset in range(start, min(end, p.log_end)):
            record = p.records.get(offset)
            if record is None or offset in got:
                continue
            if committed and _undecided_or_aborted(record):
                continue
            if _aborted(record):
                continue  # read_uncommitted: compaction leaves aborted records out
            if p.compacted and _cleaned_away(p, record):
                continue
            what = _describe(record)
            problems.append(f"offset {offset} missing: {what}")
        return problems


def _undecided_or_aborted(record: Written) -> bool:
    return record.transaction is not None and record.transaction.outcome is not Outcome.COMMITTED


def _aborted(record: Written) -> bool:
    return record.transaction is not None and record.transaction.outcome is Outcome.ABORTED


def _decided_by(record: Written, clock: int) -> bool:
    """Whether ``record`` was a plain or committed one at ``clock``."""
    transaction = record.transaction
    if transaction is None:
        return record.written_at <= clock
    return (
        transaction.outcome is Outcome.COMMITTED
        and transaction.decided_at is not None
        and transaction.decided_at <= clock
    )


def _cleaned_away(p: Partition, record: Written) -> bool:
    """Whether a cleaning may have removed ``record``: replaced by a later record of its key,
    or a tombstone past ``delete.retention.ms``."""
    for cleaning in p.cleanings:
        if not _decided_by(record, cleaning.at) or record.offset >= cleaning.log_end:
            continue
        if record.value is None and cleaning.wall_ms - p.delete_retention_ms > record.timestamp_ms:
            return True
        for offset in range(record.offset + 1, cleaning.log_end):
            later = p.records.get(offset)
            if later is not None and later.key == record.key and _decided_by(later, cleaning.at):
                return True
    return False


def _describe(record: Written) -> str:
    transaction = record.transaction
    how = "plain" if transaction is None else f"{transaction.outcome.value} in {transaction.name}"
    return f"{record.key!r}={record.value!r} ({how})"


def problems_text(problems: Sequence[str], limit: int = 20) -> str:
    shown = list(itertools.islice(problems, limit))
    more = len(problems) - len(shown)
    return "\n".join(shown + ([f"... and {more} more"] if more > 0 else []))
