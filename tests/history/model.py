"""Events and operations of a Kafka client history, and its JSON-lines form.

An *event* is one line of the file: an invocation or a completion. An *operation* is an
invocation paired with its completion. Reading validates everything the checker relies on, so
that a history which does not follow the format stops with a `HistoryError` naming the line,
rather than with a traceback from deep inside the checker.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

FUNCTIONS = ("send", "poll", "txn", "assign", "commit")
TYPES = ("invoke", "ok", "fail", "info")
# The functions whose values are lists of micro-operations.
TRANSACTIONAL = ("send", "poll", "txn")
# One line above this is refused rather than held in memory (a poll of a few thousand records
# is well under a megabyte).
MAX_LINE_BYTES = 64 * 1024 * 1024


class HistoryError(ValueError):
    """The history does not follow the format; the message names the line and the problem."""


class _Invalid(Exception):
    """A problem in one event, before the caller knows which line it is on."""


@dataclass(frozen=True, slots=True)
class Send:
    """One record sent: `value` to `key`, acknowledged at `offset` (None while unknown)."""

    key: str
    value: int
    offset: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Poll:
    """One consumer poll: per key, the `(offset, value)` records in the order delivered.

    `records` is None when the results are unknown: in an invocation, and in a failed or
    crashed operation whose driver could not say what the poll returned.
    """

    records: Mapping[str, tuple[tuple[int, int], ...]] | None = None


MicroOp = Send | Poll


@dataclass(frozen=True, slots=True, eq=False)
class Event:
    """One line of a history. Which payload field is set depends on `f`:
    `mops` for send/poll/txn, `keys` for assign, `offsets` for commit; each is None in a
    completion that carried no value (then the invocation's value stands)."""

    index: int
    time: float
    process: int
    type: str
    f: str
    mops: tuple[MicroOp, ...] | None = None
    keys: tuple[str, ...] | None = None
    offsets: Mapping[str, int] | None = None
    # Optional: why an operation failed or crashed, as the driver put it (any JSON).
    error: Any = None
    # Optional, on poll/txn completions: keys whose assignment changed during the operation.
    rebalanced: frozenset[str] = frozenset()
    # Where the event was read from (1-based), for messages; None for events built in code.
    line: int | None = None

    @property
    def where(self) -> str:
        return f"line {self.line}" if self.line is not None else f"index {self.index}"


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    """An invocation and its completion. `completion` is None when the history ended first;
    such an operation counts as crashed (`info`). Compared by identity."""

    invoke: Event
    completion: Event | None

    @property
    def process(self) -> int:
        return self.invoke.process

    @property
    def f(self) -> str:
        return self.invoke.f

    @property
    def type(self) -> str:
        return self.completion.type if self.completion is not None else "info"

    @property
    def mops(self) -> tuple[MicroOp, ...]:
        """The micro-operations, with the results the completion reported if it did."""
        if self.completion is not None and self.completion.mops is not None:
            return self.completion.mops
        return self.invoke.mops or ()

    @property
    def keys(self) -> tuple[str, ...]:
        """An assign's keys, as completed (else as invoked)."""
        if self.completion is not None and self.completion.keys is not None:
            return self.completion.keys
        return self.invoke.keys or ()

    @property
    def rebalanced(self) -> frozenset[str]:
        return self.completion.rebalanced if self.completion is not None else frozenset()

    def ref(self) -> dict[str, Any]:
        """A short JSON reference to this operation, for reports."""
        completion = self.completion
        return {
            "process": self.process,
            "f": self.f,
            "type": self.type,
            "invoke": self.invoke.index,
            "complete": completion.index if completion is not None else None,
        }


# Reading -------------------------------------------------------------------------------------


def read_history(path: str | Path) -> list[Event]:
    """Every event of a JSON-lines history file; `HistoryError` names the first bad line."""
    name = str(path)
    with open(path, "rb") as file:
        return parse_lines(_bounded_lines(file, name), name)


def _bounded_lines(file: BinaryIO, name: str) -> Iterator[str]:
    number = 0
    while data := file.readline(MAX_LINE_BYTES + 1):
        number += 1
        if len(data) > MAX_LINE_BYTES:
            raise HistoryError(f"{name}:{number}: line longer than {MAX_LINE_BYTES} bytes")
        try:
            yield data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise HistoryError(f"{name}:{number}: not UTF-8 text ({error.reason})") from None


def parse_lines(lines: Iterable[str], source: str = "history") -> list[Event]:
    """Events from JSON lines (blank lines are skipped)."""
    events = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            events.append(parse_event(_load_json(text), line=number))
        except _Invalid as problem:
            raise HistoryError(f"{source}:{number}: {problem}") from None
    return events


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise _Invalid("not JSON: nested too deeply") from None
    except ValueError as error:
        raise _Invalid(f"not JSON: {error}") from None


def parse_event(obj: Any, line: int | None = None) -> Event:
    """One event from its decoded JSON object; `_Invalid` says what is wrong with it."""
    if not isinstance(obj, dict):
        raise _Invalid(f"an event is a JSON object, not {_show(obj)}")
    for field in ("index", "time", "process", "type", "f"):
        if field not in obj:
            raise _Invalid(f"missing field {field!r}")
    index = _integer(obj["index"], "index", minimum=0)
    time = obj["time"]
    if type(time) not in (int, float) or not math.isfinite(time) or time < 0:
        raise _Invalid(f"time must be a number of seconds >= 0, not {_show(time)}")
    process = _integer(obj["process"], "process", minimum=0)
    kind, f = obj["type"], obj["f"]
    if kind not in TYPES:
        raise _Invalid(f"type must be one of {', '.join(TYPES)}, not {_show(kind)}")
    if f not in FUNCTIONS:
        raise _Invalid(f"f must be one of {', '.join(FUNCTIONS)}, not {_show(f)}")
    value = obj.get("value")
    mops = keys = offsets = None
    if value is None:
        if kind == "invoke" or (kind == "ok" and f in TRANSACTIONAL):
            raise _Invalid(f"an {kind} {f} needs a value")
    elif f in TRANSACTIONAL:
        mops = _micro_ops(value, f, kind)
    elif f == "assign":
        keys = tuple(_list_of_keys(value, "an assign's value"))
    else:
        offsets = _committed_offsets(value)
    rebalanced = obj.get("rebalanced")
    return Event(
        index=index,
        time=float(time),
        process=process,
        type=kind,
        f=f,
        mops=mops,
        keys=keys,
        offsets=offsets,
        error=obj.get("error"),
        rebalanced=frozenset(_list_of_keys(rebalanced, "rebalanced"))
        if rebalanced
        else frozenset(),
        line=line,
    )


def _micro_ops(value: Any, f: str, kind: str) -> tuple[MicroOp, ...]:
    if not isinstance(value, list) or not value:
        raise _Invalid(f"a {f}'s value is a non-empty list of micro-ops, not {_show(value)}")
    mops: list[MicroOp] = []
    for position, mop in enumerate(value):
        where = f"micro-op {position}"
        if not isinstance(mop, list) or not mop or mop[0] not in ("send", "poll"):
            raise _Invalid(
                f'{where} must be ["send", key, value] or ["poll", ...], not {_show(mop)}'
            )
        if f != "txn" and mop[0] != f:
            raise _Invalid(f"{where}: a {f} holds only {f} micro-ops (mix them in a txn)")
        mops.append(_send(mop, where, kind) if mop[0] == "send" else _poll(mop, where, kind))
    return tuple(mops)


def _send(mop: list[Any], where: str, kind: str) -> Send:
    if len(mop) != 3:
        raise _Invalid(f'{where}: a send is ["send", key, value], not {_show(mop)}')
    key = _key(mop[1], where)
    written = mop[2]
    if kind != "invoke" and isinstance(written, list):
        if len(written) != 2:
            raise _Invalid(f"{where}: a completed send's value is [offset, value]")
        offset = None if written[0] is None else _integer(written[0], f"{where}'s offset", 0)
        return Send(key, _integer(written[1], f"{where}'s value"), offset)
    return Send(key, _integer(written, f"{where}'s value"))


def _poll(mop: list[Any], where: str, kind: str) -> Poll:
    if len(mop) == 1:
        if kind == "ok":
            raise _Invalid(f'{where}: an ok poll is ["poll", {{key: [[offset, value], ...]}}]')
        return Poll()
    if kind == "invoke" or len(mop) != 2 or not isinstance(mop[1], dict):
        raise _Invalid(f'{where}: a poll is ["poll"] invoked, ["poll", {{key: records}}] done')
    records: dict[str, tuple[tuple[int, int], ...]] = {}
    for key, pairs in mop[1].items():
        if not key:
            raise _Invalid(f"{where}: keys are non-empty strings")
        if not isinstance(pairs, list):
            raise _Invalid(f"{where}: key {key!r} maps to a list of [offset, value]")
        checked = []
        for pair in pairs:
            # Polls hold most of a history's data: check each record inline.
            if type(pair) is list and len(pair) == 2:
                offset, value = pair
                if type(offset) is int and offset >= 0 and type(value) is int:
                    checked.append((offset, value))
                    continue
            raise _Invalid(
                f"{where}: a record of {key!r} is [offset >= 0, value], not {_show(pair)}"
            )
        records[key] = tuple(checked)
    return Poll(records)


def _committed_offsets(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise _Invalid(f"a commit's value is {{key: offset}}, not {_show(value)}")
    return {
        _key(key, "a commit"): _integer(offset, f"the committed offset of {key!r}", 0)
        for key, offset in value.items()
    }


def _list_of_keys(value: Any, what: str) -> list[str]:
    if not isinstance(value, list):
        raise _Invalid(f"{what} is a list of keys, not {_show(value)}")
    return [_key(key, what) for key in value]


def _key(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid(
            f'{where}: a key is a non-empty string ("topic/partition"), not {_show(value)}'
        )
    return value


def _integer(value: Any, what: str, minimum: int | None = None) -> int:
    # bool is an int to Python, never to the format.
    if type(value) is not int or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise _Invalid(f"{what} must be an integer{bound}, not {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Pairing -------------------------------------------------------------------------------------


def pair(events: Sequence[Event], source: str = "history") -> list[Op]:
    """Operations from events, in the order they completed (those the history left unfinished
    last). Checks that indices increase, that each process has at most one operation
    outstanding and is never used after it crashed, that a completion matches its invocation,
    and that no value is sent to a key twice; `HistoryError` names the first line that breaks
    one of these rules."""
    outstanding: dict[int, Event] = {}
    crashed: dict[int, Event] = {}
    first_sent: dict[tuple[str, int], Event] = {}
    ops: list[Op] = []
    previous: Event | None = None

    def refuse(event: Event, problem: str) -> NoReturn:
        where = f":{event.line}" if event.line is not None else f": index {event.index}"
        raise HistoryError(f"{source}{where}: {problem}")

    for event in events:
        if previous is not None and event.index <= previous.index:
            refuse(event, f"index {event.index} does not follow index {previous.index}")
        previous = event
        process = event.process
        if event.type == "invoke":
            if process in outstanding:
                refuse(
                    event,
                    f"process {process} still has the operation of "
                    f"{outstanding[process].where} outstanding",
                )
            if process in crashed:
                refuse(
                    event,
                    f"process {process} crashed ({crashed[process].where}); a "
                    "recreated client must use a new process number",
                )
            for mop in event.mops or ():
                if isinstance(mop, Send):
                    earlier = first_sent.setdefault((mop.key, mop.value), event)
                    if earlier is not event:
                        refuse(
                            event,
                            f"value {mop.value} is sent to {mop.key!r} again (first "
                            f"at {earlier.where}); values must be unique per key",
                        )
            sends = [(m.key, m.value) for m in event.mops or () if isinstance(m, Send)]
            if len(set(sends)) != len(sends):
                refuse(
                    event,
                    "the same value is sent to the same key twice in one operation; "
                    "values must be unique per key",
                )
            outstanding[process] = event
            continue
        invoke = outstanding.pop(process, None)
        if invoke is None:
            refuse(
                event,
                f"a completion ({event.type}) of process {process}, which has no "
                "operation outstanding",
            )
        if event.f != invoke.f:
            refuse(
                event,
                f"completes a {event.f}, but process {process} invoked a "
                f"{invoke.f} ({invoke.where})",
            )
        if event.mops is not None:
            mismatch = _results_mismatch(invoke, event)
            if mismatch:
                refuse(event, f"{mismatch} (its invocation is at {invoke.where})")
        if event.type == "info":
            crashed[process] = event
        ops.append(Op(invoke, event))
    ops.extend(Op(invoke, None) for invoke in sorted(outstanding.values(), key=lambda e: e.index))
    return ops


def _results_mismatch(invoke: Event, completion: Event) -> str | None:
    """What differs between an invocation's micro-ops and its completion's, if anything."""
    asked, done = invoke.mops or (), completion.mops or ()
    if len(asked) != len(done):
        return f"{len(done)} micro-ops where the invocation has {len(asked)}"
    for position, (a, d) in enumerate(zip(asked, done, strict=True)):
        if type(a) is not type(d):
            return f"micro-op {position} is not the kind invoked"
        if isinstance(a, Send) and isinstance(d, Send) and (a.key, a.value) != (d.key, d.value):
            return f"micro-op {position} reports another key or value than was sent"
    return None


def load(path: str | Path) -> list[Op]:
    """The operations of a history file; `HistoryError` names the first bad line."""
    return pair(read_history(path), source=str(path))


# Writing -------------------------------------------------------------------------------------


def event_to_json(event: Event) -> dict[str, Any]:
    """The JSON object of one event, as the format writes it."""
    obj: dict[str, Any] = {
        "index": event.index,
        "time": event.time,
        "process": event.process,
        "type": event.type,
        "f": event.f,
    }
    if event.mops is not None:
        obj["value"] = [_mop_to_json(mop, event.type) for mop in event.mops]
    elif event.keys is not None:
        obj["value"] = list(event.keys)
    elif event.offsets is not None:
        obj["value"] = dict(event.offsets)
    else:
        obj["value"] = None
    if event.error is not None:
        obj["error"] = event.error
    if event.rebalanced:
        obj["rebalanced"] = sorted(event.rebalanced)
    return obj


def _mop_to_json(mop: MicroOp, kind: str) -> list[Any]:
    if isinstance(mop, Send):
        if kind == "invoke":
            return ["send", mop.key, mop.value]
        return ["send", mop.key, [mop.offset, mop.value]]
    if mop.records is None:
        return ["poll"]
    return ["poll", {key: [list(r) for r in records] for key, records in mop.records.items()}]


def write_history(path: str | Path, events: Iterable[Event]) -> None:
    """Write events as JSON lines."""
    with open(path, "w", encoding="utf-8") as file:
        for event in events:
            file.write(json.dumps(event_to_json(event), separators=(",", ":")) + "\n")
