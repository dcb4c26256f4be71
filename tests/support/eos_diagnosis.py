"""Why a pipeline run (:mod:`tests.support.eos_pipeline`) did not output each input exactly
once, from what the metadata store and the logs hold, per input partition: where the group's
committed offset stands against the input's end, how many of its inputs the read_committed
read found, and for each one missing, why:

- *never processed*: past the committed offset (the pipeline stalled: a partition nobody
  consumed, a member stuck, a transaction that never ended);
- *committed, not read*: its output is in the output log in a committed transaction, yet the
  read_committed consumer did not get it (a fault of the read path, not of exactly-once);
- *output aborted* or *output absent*: the offset was committed without its output, a true
  exactly-once violation; *output open*: its transaction is still under way.

Each output carries headers naming its member, transaction and input (see
:mod:`tests.support.eos_worker`), so a repeated input names the transactions that wrote it.
The partition's last owner and that member's last transaction with it come from the members'
events.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from icefloe.config import load_config
from icefloe.groups.consumer_protocol import assigned_partitions
from icefloe.groups.model import ClassicGroup, ConsumerGroup
from icefloe.groups.store import GroupStore
from icefloe.storage.batch import read_header
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import decode_batch
from icefloe.topics.registry import TopicRegistry
from tests.support.eos_pipeline import PipelineWorker


@dataclass(frozen=True)
class Output:
    """One copy of an output in the output log."""

    partition: int
    offset: int
    fate: str
    """``committed``, ``aborted`` or ``open``, by the store's aborted and open transactions."""
    member: str
    txn: str

    def __str__(self) -> str:
        return f"out[{self.partition}]@{self.offset} {self.fate} ({self.member} txn {self.txn})"


@dataclass
class Logs:
    """What the store holds of the pipeline's topics and group."""

    inputs: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Input number → (partition, offset) in the input topic."""
    input_ends: list[int] = field(default_factory=list)
    outputs: dict[bytes, list[Output]] = field(default_factory=dict)
    committed: dict[int, int] = field(default_factory=dict)
    group: list[str] = field(default_factory=list)
    """The group's record, a line per member."""


def diagnose(
    data_dir: Path,
    topics: tuple[str, str],
    group: str,
    inputs: int,
    read: Iterable[bytes],
    workers: Sequence[PipelineWorker],
) -> str:
    """A report of what went wrong, or "" if the read holds each input exactly once."""
    read_counts = Counter(read)
    logs = asyncio.run(_load(data_dir, topics, group))
    lines: list[str] = []
    by_partition: dict[int, list[int]] = {}
    for number, (partition, _) in logs.inputs.items():
        by_partition.setdefault(partition, []).append(number)
    absent_inputs = [i for i in range(inputs) if i not in logs.inputs]
    if absent_inputs:
        lines.append(f"{len(absent_inputs)} inputs are not in the input log: {absent_inputs[:10]}")
    for partition in sorted(by_partition):
        lines.extend(
            _partition_report(partition, by_partition[partition], logs, read_counts, workers)
        )
    repeated = [v for v, n in read_counts.items() if n > 1]
    for value in repeated[:10]:
        copies = "; ".join(str(o) for o in logs.outputs.get(value, []))
        lines.append(f"{value.decode()} read {read_counts[value]} times: {copies}")
    missing = any(not read_counts[f"out-{i}".encode()] for i in range(inputs))
    if not (missing or repeated):
        return ""
    return "\n".join([*lines, "the group:", *(f"  {line}" for line in logs.group)])


def _partition_report(
    partition: int,
    numbers: list[int],
    logs: Logs,
    read_counts: Counter[bytes],
    workers: Sequence[PipelineWorker],
) -> list[str]:
    committed = logs.committed.get(partition)
    offsets = {n: logs.inputs[n][1] for n in numbers}
    unread = (n for n in numbers if not read_counts[f"out-{n}".encode()])
    missing = sorted(unread, key=offsets.__getitem__)
    head = (
        f"input[{partition}]: {len(numbers)} inputs, committed offset {committed}, "
        f"log end {logs.input_ends[partition]}, last record {max(offsets.values())}; "
    )
    if not missing:
        return [head + "all read once or more"]
    why: dict[str, list[int]] = {}
    for n in missing:
        copies = logs.outputs.get(f"out-{n}".encode(), [])
        fates = {c.fate for c in copies}
        if committed is None or offsets[n] >= committed:
            reason = "never processed (past the committed offset)"
        elif "committed" in fates:
            reason = "committed in the output log, not read by read_committed"
        elif "open" in fates:
            reason = "output in a transaction still open"
        elif fates:
            reason = "output aborted, offset committed (exactly-once violated)"
        else:
            reason = "output absent, offset committed (exactly-once violated)"
        why.setdefault(reason, []).append(offsets[n])
    lines = [head + f"{len(missing)} missing"]
    for reason, missed in why.items():
        lines.append(f"  {len(missed)} {reason}: input offsets {_ranges(missed)}")
    example = logs.outputs.get(f"out-{missing[0]}".encode(), [])
    if example:
        lines.append(f"  first missing, out-{missing[0]}: {'; '.join(map(str, example))}")
    lines.extend(f"  {line}" for line in _owners(partition, workers))
    return lines


def _owners(partition: int, workers: Sequence[PipelineWorker]) -> list[str]:
    """Who owned the partition last, and how that member's last transaction with it ended."""
    held: list[tuple[float, PipelineWorker]] = []
    for worker in workers:
        for event in worker.seen("assigned"):
            if partition in event["partitions"]:
                held.append((event["t"], worker))
    if not held:
        return ["never assigned to any member"]
    since, owner = max(held, key=lambda h: h[0])
    gone = [
        e
        for e in owner.events_copy()
        if e["event"] in ("revoked", "lost") and partition in e["partitions"] and e["t"] > since
    ]
    status = f"until {gone[0]['event']}" if gone else "to the end"
    last = None
    for event in owner.events_copy():
        if partition in event.get("partitions", ()) and event["event"] in (
            "sending",
            "sent",
            "committed",
            "aborted",
            "new-producer",
        ):
            last = event
    outcome = "none" if last is None else f"txn {last['txn']} {last['event']}"
    if last is not None and "error" in last:
        outcome += f" ({last['error']})"
    return [
        f"last owner {owner.transactional_id} (pid {owner.pid}) {status}; "
        f"its last transaction with it: {outcome}; {owner.ending()}"
    ]


def _ranges(offsets: list[int]) -> str:
    spans: list[list[int]] = []
    for offset in sorted(offsets):
        if spans and offset == spans[-1][1] + 1:
            spans[-1][1] = offset
        else:
            spans.append([offset, offset])
    shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans[:12])
    return shown + (f" and {len(spans) - 12} more runs" if len(spans) > 12 else "")


async def _load(data_dir: Path, topics: tuple[str, str], group: str) -> Logs:
    config = load_config(env={}, overrides={"data_dir": str(data_dir)})
    logs = Logs()
    async with await StreamStorage.open(config) as storage:
        registry = TopicRegistry(storage)
        source, sink = await registry.get(topics[0]), await registry.get(topics[1])
        assert source is not None
        assert sink is not None
        for partition, stream in enumerate(source.streams):
            logs.input_ends.append(await storage.log_end(stream))
            fate = await _fates(storage, stream)
            for producer, record in await _records(storage, stream):
                if record.value is not None and fate(producer, record.offset) == "committed":
                    logs.inputs[int(record.value)] = (partition, record.offset)
        for partition, stream in enumerate(sink.streams):
            fate = await _fates(storage, stream)
            for producer, record in await _records(storage, stream):
                origin = {k: (v or b"").decode() for k, v in record.headers}
                output = Output(
                    partition,
                    record.offset,
                    fate(producer, record.offset),
                    origin.get("member", "?"),
                    origin.get("txn", "?"),
                )
                logs.outputs.setdefault(record.value or b"", []).append(output)
        store = GroupStore(storage.metadata)
        offsets = await store.fetch_offsets(group, {topics[0]: range(len(source.streams))})
        logs.committed = {p: o.offset for (_, p), o in offsets.items()}
        stored = await store.load(group)
        logs.group = list(_describe(None if stored is None else stored.group))
    return logs


async def _fates(storage: StreamStorage, stream: int) -> Callable[[int, int], str]:
    """The fate of a producer's transactional record at an offset, as the store has it: in
    an aborted transaction's range, after an open transaction's start, or committed."""
    aborted = await storage.transactions.aborted(stream, 0, 1 << 62)
    opened = await storage.transactions.stored_open_marks(stream)

    def fate(producer: int, offset: int) -> str:
        if any(
            a.producer_id == producer and a.first_offset <= offset < a.marker_offset
            for a in aborted
        ):
            return "aborted"
        if any(m.producer_id == producer and m.first_offset <= offset for m in opened):
            return "open"
        return "committed"

    return fate


async def _records(storage: StreamStorage, stream: int) -> list[tuple[int, Any]]:
    """(producer id, record) of every data record of the stream, control batches left out."""
    offset, end = await storage.log_start(stream), await storage.log_end(stream)
    found: list[tuple[int, Any]] = []
    while offset < end:
        result = await storage.read(stream, offset)
        for part in result.parts:
            data = bytes(part)
            position = 0
            while position < len(data):
                size = read_header(data, position).size
                header, records = decode_batch(data[position : position + size], verify_crc=False)
                position += size
                if header.attributes & 0x20:  # a control batch: a marker
                    continue
                found.extend((header.producer_id, r) for r in records if r.offset >= offset)
        if result.next_offset <= offset:
            break
        offset = result.next_offset
    return found


def _describe(group: ClassicGroup | ConsumerGroup | None) -> Iterable[str]:
    if group is None:
        yield "no group record"
    elif isinstance(group, ClassicGroup):
        yield f"classic, {group.state.value}, generation {group.generation}"
        for m in group.members:
            owned = assigned_partitions(m.assignment) if m.assignment else {}
            yield f"member {m.member_id} joined={m.joined} assigned {owned}"
    else:
        yield f"consumer, group epoch {group.group_epoch}"
        for member in group.members:
            assigned = sorted(p for ps in member.assigned.values() for p in ps)
            revoking = sorted(p for ps in member.pending_revocation.values() for p in ps)
            yield (
                f"member {member.member_id} epoch {member.member_epoch} "
                f"{member.state.value} assigned {assigned} revoking {revoking}"
            )
