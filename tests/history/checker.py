"""Checks a Kafka client history for the anomalies of Jepsen's Kafka workload
(`jepsen.tests.kafka`), with the same names and, unless said otherwise, the same definitions.

Everything rests on each key's *version order*: the values known at each offset of the key,
gathered from the offsets every poll returned (of operations whatever their outcome: Kafka
consumers must only ever see safe data) and from the acknowledged offsets of sends whose
operation must have committed (ok, or info with some value an ok poll read). Kafka's offsets
have gaps (transaction markers, aborted records), so positions are *indices*: the rank of an
offset among the known ones. Skips and reorderings are judged by index, never by offset
arithmetic: two records are adjacent when no known offset lies between them.

`check` runs every check in this module; each check's docstring defines its anomaly.
`allowed_anomalies` says which are normal for Kafka (Jepsen's `allowed-error-types`):

- int-send-skip: transactions' sends interleave in Kafka's model, so one operation's sends
  to a key need not be adjacent;
- G0: Kafka does not isolate writes, so write cycles between transactions are normal;
- G1c, when ww dependencies are inferred (the default, Jepsen's `--ww-deps`): with no write
  isolation, cycles like T1 -ww-> T2 -wr-> T1 are expected. Without ww dependencies only wr
  edges remain, and any cycle, which a read_committed consumer must never produce, counts.

Jepsen also allows poll-skip and nonmonotonic-poll when consumers subscribe rather than
assign, as a rebalance may move them at any time; here the driver records every change of
assignment or position as an `assign`, so these two stay forbidden. Everything else found
makes the history invalid.
"""

from __future__ import annotations

import gc
import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from tests.history.cycles import Dependency, DependencyGraph, find_cycles
from tests.history.model import TRANSACTIONAL, Op, Poll, Send

# Every anomaly the checker reports, in the order reports list them.
ANOMALY_TYPES = (
    "inconsistent-offsets",
    "duplicate",
    "garbage-read",
    "G1a",
    "precommitted-read",
    "lost-write",
    "unseen",
    "poll-skip",
    "nonmonotonic-poll",
    "int-poll-skip",
    "int-nonmonotonic-poll",
    "nonmonotonic-send",
    "int-nonmonotonic-send",
    "int-send-skip",
    "G0",
    "G1c",
    "empty-transaction-graph",
)
# How many values a skip example lists at most.
MAX_SKIPPED_SHOWN = 32


def allowed_anomalies(*, ww_deps: bool = True) -> frozenset[str]:
    """The anomaly types that are normal for Kafka and leave a history valid."""
    allowed = {"int-send-skip", "G0"}
    if ww_deps:
        allowed.add("G1c")
    return frozenset(allowed)


@dataclass(frozen=True, slots=True)
class VersionOrder:
    """What the history tells of one key's log: `offsets` are the known offsets in order,
    `values_at[i]` the values seen at `offsets[i]` (more than one is inconsistent-offsets).
    `by_index[i]` is the value taken for index i (the smallest if several); `by_value` maps
    each of those to its index (its last, if it appears twice)."""

    key: str
    offsets: list[int]
    values_at: list[list[int]]
    by_index: list[int]
    by_value: dict[int, int]

    @classmethod
    def from_log(cls, key: str, log: dict[int, int], several: dict[int, set[int]]) -> VersionOrder:
        """From the first value seen at each offset, and every value where there were more."""
        offsets = sorted(log)
        values_at = [sorted(several[o]) if o in several else [log[o]] for o in offsets]
        by_index = [values[0] for values in values_at]
        by_value = {value: index for index, value in enumerate(by_index)}
        return cls(key, offsets, values_at, by_index, by_value)

    def delta(self, earlier: int, later: int) -> int | None:
        """How many indices `later` lies after `earlier`; None if either has no index."""
        i, j = self.by_value.get(earlier), self.by_value.get(later)
        return None if i is None or j is None else j - i

    def between(self, earlier: int, later: int) -> list[int]:
        """The values strictly between two (the first `MAX_SKIPPED_SHOWN`)."""
        i, j = self.by_value[earlier], self.by_value[later]
        return self.by_index[i + 1 : min(j, i + 1 + MAX_SKIPPED_SHOWN)]


@dataclass(frozen=True)
class Report:
    """What `check` found: per anomaly type, how many cases and the first few as examples
    (JSON-able dicts), plus statistics of the history."""

    counts: dict[str, int]
    examples: dict[str, list[dict[str, Any]]]
    allowed: frozenset[str]
    stats: dict[str, Any]
    ww_deps: bool = True

    @property
    def anomaly_types(self) -> list[str]:
        return [name for name in ANOMALY_TYPES if name in self.counts]

    @property
    def forbidden(self) -> list[str]:
        """The anomaly types found that make the history invalid."""
        return [name for name in self.anomaly_types if name not in self.allowed]

    @property
    def valid(self) -> bool:
        return not self.forbidden

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "forbidden": self.forbidden,
            "anomalies": {
                name: {
                    "count": self.counts[name],
                    "allowed": name in self.allowed,
                    "examples": self.examples.get(name, []),
                }
                for name in self.anomaly_types
            },
            "allowed_types": sorted(self.allowed),
            "ww_deps": self.ww_deps,
            "stats": self.stats,
        }

    def summary(self) -> str:
        """A few readable lines: the verdict, the statistics, each anomaly and an example."""
        verdict = "valid" if self.valid else "INVALID: " + ", ".join(self.forbidden)
        stats = self.stats
        lines = [verdict]
        for f, by_type in stats["operations"].items():
            counts = ", ".join(f"{n} {kind}" for kind, n in by_type.items())
            lines.append(f"  {f}: {counts}")
        lines.append(
            f"  {stats['acknowledged_writes']} acknowledged writes, {stats['values_read']} "
            f"values read, {stats['keys']} keys, {stats['dependencies']['ww']} ww and "
            f"{stats['dependencies']['wr']} wr dependencies"
        )
        for name in self.anomaly_types:
            status = "allowed" if name in self.allowed else "forbidden"
            lines.append(f"  {name}: {self.counts[name]} ({status})")
            for first in self.examples.get(name, [])[:1]:
                example = json.dumps(first, separators=(",", ":"))
                lines.append(
                    "    e.g. " + (example if len(example) <= 300 else example[:297] + "...")
                )
        return "\n".join(lines)


class _Found:
    """Counts the cases of each anomaly and keeps the first few."""

    def __init__(self, max_examples: int) -> None:
        self.max_examples = max_examples
        self.counts: Counter[str] = Counter()
        self.examples: dict[str, list[dict[str, Any]]] = defaultdict(list)

    def add(self, anomaly: str, example: dict[str, Any]) -> None:
        self.counts[anomaly] += 1
        if len(self.examples[anomaly]) < self.max_examples:
            self.examples[anomaly].append(example)


class _History:
    """The operations and the indexes every check shares; `ops` positions identify them."""

    def __init__(self, ops: Sequence[Op]) -> None:
        self.ops = list(ops)
        # Per operation: key -> its sends, in order
        self.writes: list[dict[str, list[Send]]] = []
        # Per operation: key -> every (offset, value) it polled, in order across its polls
        self.reads: list[dict[str, list[tuple[int, int]]]] = []
        # key -> value -> position of the operation that sent it
        self.writer_of: dict[str, dict[int, int]] = defaultdict(dict)
        # key -> values that ok operations polled
        self.ok_reads: dict[str, set[int]] = defaultdict(set)
        for position, op in enumerate(self.ops):
            writes: dict[str, list[Send]] = {}
            reads: dict[str, list[tuple[int, int]]] = {}
            for mop in op.mops:
                if isinstance(mop, Send):
                    writes.setdefault(mop.key, []).append(mop)
                    self.writer_of[mop.key].setdefault(mop.value, position)
                elif mop.records:
                    for key, polled in mop.records.items():
                        if polled:
                            reads.setdefault(key, []).extend(polled)
            if op.type == "ok":
                for key, records in reads.items():
                    self.ok_reads[key].update(map(itemgetter(1), records))
            self.writes.append(writes)
            self.reads.append(reads)
        self.committed = [
            self._must_have_committed(op, writes)
            for op, writes in zip(self.ops, self.writes, strict=True)
        ]
        self.orders = self._version_orders()

    def _must_have_committed(self, op: Op, writes: dict[str, list[Send]]) -> bool:
        """ok, or info with a value some ok poll read (Jepsen's `must-have-committed?`)."""
        if op.type == "ok":
            return True
        return op.type == "info" and any(
            send.value in self.ok_reads.get(key, ())
            for key, sends in writes.items()
            for send in sends
        )

    def _version_orders(self) -> dict[str, VersionOrder]:
        # key -> offset -> the first value known there; and every value where there are more
        logs: dict[str, dict[int, int]] = defaultdict(dict)
        several: dict[str, dict[int, set[int]]] = defaultdict(dict)
        for position in range(len(self.ops)):
            for key, records in self._known_records(position):
                log = logs[key]
                for offset, value in records:
                    first = log.setdefault(offset, value)
                    if first != value:
                        several[key].setdefault(offset, {first}).add(value)
        return {
            key: VersionOrder.from_log(key, log, several.get(key, {}))
            for key, log in sorted(logs.items())
        }

    def _known_records(self, position: int) -> Iterator[tuple[str, list[tuple[int, int]]]]:
        """Per key, the `(offset, value)` records an operation tells of: all it polled, and its
        sends' acknowledged offsets if it must have committed."""
        yield from self.reads[position].items()
        if self.committed[position]:
            for key, sends in self.writes[position].items():
                yield key, [(s.offset, s.value) for s in sends if s.offset is not None]

    def ok_reader(self, key: str, value: int) -> Op | None:
        for op, reads in zip(self.ops, self.reads, strict=True):
            if op.type == "ok" and any(v == value for _, v in reads.get(key, ())):
                return op
        return None


def check(ops: Sequence[Op], *, ww_deps: bool = True, max_examples: int = 8) -> Report:
    """Check a history's operations (from `model.pair` or `model.load`) for every anomaly.

    `ww_deps` infers write-write dependencies from the version orders, as Jepsen does by
    default; without them only write-read edges remain, to hunt for pure wr cycles (G1c is
    then forbidden). `max_examples` bounds the examples kept per anomaly type.
    """
    with _without_cyclic_gc():
        return _check(ops, ww_deps=ww_deps, max_examples=max_examples)


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """The checker allocates millions of small objects and frees none until it is done: the
    cyclic collector would scan them again and again for nothing (half the time, measured)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _check(ops: Sequence[Op], *, ww_deps: bool, max_examples: int) -> Report:
    history = _History(ops)
    found = _Found(max_examples)
    _inconsistent_offsets(history, found)
    _duplicates(history, found)
    _garbage_reads(history, found)
    _aborted_reads(history, found)
    _precommitted_reads(history, found)
    _lost_writes(history, found)
    _unseen(history, found)
    _poll_order(history, found)
    _internal_polls(history, found)
    _send_order(history, found)
    _internal_sends(history, found)
    graph = _dependency_graph(history, ww_deps=ww_deps)
    _cycles(history, graph, found)
    if not graph.ww and not graph.wr:
        found.add(
            "empty-transaction-graph",
            {"why": "no value was read and no two writes were ordered: nothing was checked"},
        )
    return Report(
        counts=dict(found.counts),
        examples=dict(found.examples),
        allowed=allowed_anomalies(ww_deps=ww_deps),
        stats=_statistics(history, graph),
        ww_deps=ww_deps,
    )


def _inconsistent_offsets(history: _History, found: _Found) -> None:
    """inconsistent-offsets: two different values are known at one offset of a key (from
    polls, or from acknowledged sends that must have committed)."""
    for key, order in history.orders.items():
        for index, (offset, values) in enumerate(zip(order.offsets, order.values_at, strict=True)):
            if len(values) > 1:
                found.add(
                    "inconsistent-offsets",
                    {"key": key, "offset": offset, "index": index, "values": values},
                )


def _duplicates(history: _History, found: _Found) -> None:
    """duplicate: one value is known at more than one offset of a key: it was written twice."""
    for key, order in history.orders.items():
        if len(order.by_value) == len(order.offsets) and not any(
            len(values) > 1 for values in order.values_at
        ):
            continue  # every offset holds one value, and no value two offsets
        offsets_of: dict[int, list[int]] = defaultdict(list)
        for offset, values in zip(order.offsets, order.values_at, strict=True):
            for value in values:
                offsets_of[value].append(offset)
        for value, offsets in offsets_of.items():
            if len(offsets) > 1:
                found.add(
                    "duplicate",
                    {"key": key, "value": value, "count": len(offsets), "offsets": offsets[:8]},
                )


def _garbage_reads(history: _History, found: _Found) -> None:
    """garbage-read: a poll returned a value that no operation sent to that key. (Jepsen stops
    its analysis with :no-writer-of-value on such a history; here it is one more anomaly.)"""
    for op, reads in zip(history.ops, history.reads, strict=True):
        for key, records in reads.items():
            writers = history.writer_of.get(key, {})
            for offset, value in records:
                if value not in writers:
                    found.add(
                        "garbage-read",
                        {"key": key, "value": value, "offset": offset, "reader": op.ref()},
                    )


def _aborted_reads(history: _History, found: _Found) -> None:
    """G1a (aborted read): an ok poll or transaction read a value that only a failed
    operation sent."""
    failed: dict[str, dict[int, Op]] = defaultdict(dict)
    for op, writes in zip(history.ops, history.writes, strict=True):
        if op.type == "fail":
            for key, sends in writes.items():
                failed[key].update((send.value, op) for send in sends)
    for op, reads in zip(history.ops, history.reads, strict=True):
        if op.type != "ok":
            continue
        for key, records in reads.items():
            failed_here = failed.get(key)
            if not failed_here:
                continue
            for value in dict.fromkeys(value for _, value in records):
                writer = failed_here.get(value)
                if writer is not None:
                    found.add(
                        "G1a",
                        {"key": key, "value": value, "writer": writer.ref(), "reader": op.ref()},
                    )


def _precommitted_reads(history: _History, found: _Found) -> None:
    """precommitted-read: a transaction polled a value it sent itself. Most databases let a
    transaction read its own writes; Kafka's read_committed consumers must not see any
    record of a transaction before it commits. One case per operation."""
    for op, writes, reads in zip(history.ops, history.writes, history.reads, strict=True):
        for key, sends in writes.items():
            read = {value for _, value in reads.get(key, ())}
            own = [send.value for send in sends if send.value in read]
            if own:
                found.add("precommitted-read", {"key": key, "value": own[0], "op": op.ref()})
                break


def _lost_writes(history: _History, found: _Found) -> None:
    """lost-write: a value that must have been written (sent by an ok operation, or an info
    one some of whose values an ok poll read) lies in its key's version order at or before the
    highest index an ok poll reached, yet no ok poll read it.

    The highest index is the first index of the latest value read; a value counts as below it
    when its last index is (so a value written twice is judged by its later copy)."""
    for key, order in history.orders.items():
        read = history.ok_reads.get(key)
        if not read:
            continue
        first_index: dict[int, int] = {}
        last_index: dict[int, int] = {}
        for index, values in enumerate(order.values_at):
            for value in values:
                first_index.setdefault(value, index)
                last_index[value] = index
        bound, highest = max(
            ((first_index[v], v) for v in read if v in first_index), default=(-1, 0)
        )
        reader: Op | None = None
        for index in range(bound + 1):
            for value in order.values_at[index]:
                if last_index[value] != index or value in read:
                    continue
                position = history.writer_of.get(key, {}).get(value)
                if position is None or not history.committed[position]:
                    continue
                reader = reader or history.ok_reader(key, highest)
                found.add(
                    "lost-write",
                    {
                        "key": key,
                        "value": value,
                        "index": first_index[value],
                        "max_read_index": bound,
                        "writer": history.ops[position].ref(),
                        "max_read": reader.ref() if reader is not None else None,
                    },
                )


def _unseen(history: _History, found: _Found) -> None:
    """unseen: a value an ok send acknowledged that no ok poll read. Unlike lost-write, no
    later read proves a consumer got that far; Jepsen still counts it as an error, because its
    runs end with polls that catch up with every acknowledged offset (so should a driver's)."""
    for op, writes in zip(history.ops, history.writes, strict=True):
        if op.type != "ok":
            continue
        for key, sends in writes.items():
            read = history.ok_reads.get(key, set())
            for send in sends:
                if send.value not in read:
                    found.add(
                        "unseen",
                        {
                            "key": key,
                            "value": send.value,
                            "offset": send.offset,
                            "writer": op.ref(),
                        },
                    )


def _poll_order(history: _History, found: _Found) -> None:
    """poll-skip: a process's poll of a key starts more than one index after where its
    previous poll of that key ended (known values between them were never delivered to it);
    nonmonotonic-poll: it starts at or before where the previous one ended.

    Only consecutive polls of one process and key with no assign between are compared (an
    assign records any change of assignment or position, so it resets every key), and not a
    key the operation's `rebalanced` lists. A poll moves the position whatever the operation's
    outcome (Kafka does not rewind a consumer when a transaction aborts; a driver that seeks
    back records an assign); one whose results are unknown resets the process."""
    # process -> key -> (operation, last value it polled)
    last: dict[int, dict[str, tuple[Op, int]]] = defaultdict(dict)
    for op, reads in zip(history.ops, history.reads, strict=True):
        positions = last[op.process]
        if op.f == "assign":
            if op.type != "fail":
                positions.clear()
            continue
        if op.f not in ("poll", "txn"):
            continue
        for key, records in reads.items():
            if key in op.rebalanced or key not in positions:
                continue
            previous, value = positions[key]
            first = records[0][1]
            order = history.orders[key]
            delta = order.delta(value, first)
            if delta is None or delta == 1:
                continue
            example: dict[str, Any] = {"key": key, "values": [value, first], "delta": delta}
            if delta > 1:
                example["skipped"] = order.between(value, first)
            example["ops"] = [previous.ref(), op.ref()]
            found.add("poll-skip" if delta > 1 else "nonmonotonic-poll", example)
        if any(isinstance(mop, Poll) and mop.records is None for mop in op.mops):
            positions.clear()
        else:
            for key, records in reads.items():
                positions[key] = (op, records[-1][1])


def _internal_polls(history: _History, found: _Found) -> None:
    """int-poll-skip: within one operation, two consecutive records polled from a key are not
    adjacent in the version order (known values lie between them); int-nonmonotonic-poll:
    the second lies at or before the first. Keys the operation's `rebalanced` lists are left
    out (Jepsen's rebalance log)."""
    for op, reads in zip(history.ops, history.reads, strict=True):
        for key, records in reads.items():
            if key not in op.rebalanced:
                values = [value for _, value in records]
                _check_adjacent(
                    history.orders[key], values, op, found, "int-poll-skip", "int-nonmonotonic-poll"
                )


def _internal_sends(history: _History, found: _Found) -> None:
    """int-send-skip: one operation's consecutive sends to a key are not adjacent in the
    version order (other records came between them: normal in Kafka, allowed);
    int-nonmonotonic-send: the second lies at or before the first."""
    for op, writes in zip(history.ops, history.writes, strict=True):
        for key, sends in writes.items():
            order = history.orders.get(key)
            if order is not None:
                values = [send.value for send in sends]
                _check_adjacent(order, values, op, found, "int-send-skip", "int-nonmonotonic-send")


def _check_adjacent(
    order: VersionOrder, values: Iterable[int], op: Op, found: _Found, skip: str, nonmonotonic: str
) -> None:
    """Report consecutive `values` of one operation that are not adjacent in `order`: as
    `skip` when values lie between them, as `nonmonotonic` when they go backwards or repeat."""
    by_value = order.by_value
    earlier, i = None, None
    for later in values:
        j = by_value.get(later)
        if i is not None and j is not None and j - i != 1:
            assert earlier is not None
            delta = j - i
            example: dict[str, Any] = {"key": order.key, "values": [earlier, later], "delta": delta}
            if delta > 1:
                example["skipped"] = order.between(earlier, later)
            example["op"] = op.ref()
            found.add(skip if delta > 1 else nonmonotonic, example)
        earlier, i = later, j


def _send_order(history: _History, found: _Found) -> None:
    """nonmonotonic-send: a process's first send to a key in one operation lies at or before
    the last send to that key of its previous ok or info operation, in the version order.

    As in Jepsen, an assign keeps the comparison only for the keys it still assigns."""
    # process -> key -> (operation, last value it sent)
    last: dict[int, dict[str, tuple[Op, int]]] = defaultdict(dict)
    for op, writes in zip(history.ops, history.writes, strict=True):
        if op.type not in ("ok", "info"):
            continue
        sent = last[op.process]
        if op.f == "assign":
            kept = set(op.keys)
            for key in [k for k in sent if k not in kept]:
                del sent[key]
            continue
        for key, sends in writes.items():
            if key in sent:
                previous, value = sent[key]
                first = sends[0].value
                delta = history.orders[key].delta(value, first) if key in history.orders else None
                if delta is not None and delta < 1:
                    found.add(
                        "nonmonotonic-send",
                        {
                            "key": key,
                            "values": [value, first],
                            "delta": delta,
                            "ops": [previous.ref(), op.ref()],
                        },
                    )
            sent[key] = (op, sends[-1].value)


def _dependency_graph(history: _History, *, ww_deps: bool) -> DependencyGraph:
    """ww and wr edges between send, poll and txn operations, whatever their outcome (as in
    Jepsen: a failed operation only gets edges when its value was read, which is G1a)."""
    graph = DependencyGraph()
    if ww_deps:
        for key, order in history.orders.items():
            writers = history.writer_of.get(key, {})
            for value, writer in writers.items():
                index = order.by_value.get(value)
                if not index:  # unknown, or the first value of the key
                    continue
                previous = order.by_index[index - 1]
                earlier = writers.get(previous)
                if earlier is not None:
                    graph.add(earlier, writer, Dependency("ww", key, previous, value))
    for reader, reads in enumerate(history.reads):
        # writer -> the first (key, value) this reader polled of it
        read_from: dict[int, tuple[str, int]] = {}
        for key, records in reads.items():
            writers = history.writer_of.get(key, {})
            for _, value in records:
                source = writers.get(value)
                if source is not None and source not in read_from:
                    read_from[source] = (key, value)
        for source, (key, value) in read_from.items():
            graph.add(source, reader, Dependency("wr", key, value))
    return graph


def _cycles(history: _History, graph: DependencyGraph, found: _Found) -> None:
    """G0: a cycle of ww dependencies alone (dirty write). G1c: a cycle of ww and wr
    dependencies with at least one wr (circular information flow). One cycle is reported
    for each group of operations tied together."""
    for cycle in find_cycles(graph):
        found.add(
            cycle.anomaly,
            {
                "cycle": [history.ops[node].ref() for node in cycle.nodes],
                "steps": [step.to_json() for step in cycle.steps],
            },
        )


def _statistics(history: _History, graph: DependencyGraph) -> dict[str, Any]:
    operations: dict[str, Counter[str]] = {
        f: Counter() for f in (*TRANSACTIONAL, "assign", "commit")
    }
    for op in history.ops:
        operations[op.f][op.type] += 1
    keys = set(history.writer_of) | set(history.orders)
    return {
        "operations": {
            f: {kind: by_type[kind] for kind in ("ok", "fail", "info") if by_type[kind]}
            for f, by_type in operations.items()
            if by_type
        },
        "unfinished": sum(1 for op in history.ops if op.completion is None),
        "acknowledged_writes": sum(
            len(sends)
            for op, writes in zip(history.ops, history.writes, strict=True)
            if op.type == "ok"
            for sends in writes.values()
        ),
        "values_read": sum(len(values) for values in history.ok_reads.values()),
        "keys": len(keys),
        "dependencies": {"ww": graph.count("ww"), "wr": graph.count("wr")},
    }
