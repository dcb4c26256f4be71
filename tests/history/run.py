"""One history run: a 3-broker cluster, real clients recording every operation, faults, then
the history checked, the availability during each fault measured and both tables compared
with what the final read saw.

The suite runs a short one (tests/integration/test_histories.py); the long runs go through
``python -m tests.history.run`` (``--help`` for the options), which prints one JSON line per
run (:func:`summary`) and writes each run's history, full result, faults and clients' logs to
a folder of its own.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from confluent_kafka.admin import AdminClient, NewTopic

from tests.history import compacted
from tests.history.checker import check
from tests.history.environment import OBJECT_CHOICES, STORE_CHOICES, environment
from tests.history.java_client import JavaSender
from tests.history.model import load
from tests.history.nemesis import KINDS, Nemesis
from tests.history.recorder import History
from tests.history.workload import (
    Poller,
    Sender,
    Setup,
    Transactor,
    Values,
    Worker,
    final_read,
)
from tests.support.chaos import (
    caught_up_tables,
    check_tables,
    client_logger,
    table_rows,
    wait_for_brokers,
)

BROKERS: Final = 3
TOPIC: Final = "history"
SETTINGS: Final = {
    # Tables close behind the stream, so that comparing them at the end is a real check.
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "5",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "1",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "1",
    # A paused broker's session and producer leases end during its pause (see nemesis).
    "ICEFLOE_BROKER__SESSION_TTL_S": "6",
    "ICEFLOE_STORAGE__PRODUCER_LEASE_S": "4",
}
TABLES_GIVE_UP_S: Final = 300.0
STALL_AFTER_S: Final = 30.0
"""A fault's stall is looked for from its start to this long after its end."""


@dataclass
class RunResult:
    seed: int
    faults_asked: list[str]
    protocol: str
    store: str
    objects: str = "local"
    seconds: float = 0.0
    operations: int = 0
    clients_replaced: int = 0
    """Clients replaced after an operation whose outcome they could not know."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    check: dict[str, Any] = field(default_factory=dict)
    """The checker's report of the history."""
    unread_keys: list[str] = field(default_factory=list)
    """Keys the final read could not read to their end (a last stable offset stuck)."""
    tables: dict[str, list[str]] = field(default_factory=dict)
    tables_after_s: float | None = None
    """When both tables held what the final read saw, after it (``None``: never)."""
    compacted: dict[str, Any] = field(default_factory=dict)
    """The compacted topic's check (:func:`tests.history.compacted.check_compacted`), if the
    run had keyed senders."""
    problems: list[str] = field(default_factory=list)
    """Failures of the run itself: a fault that did not happen, a worker's own error."""
    client_hangs: list[str] = field(default_factory=list)
    """Client calls stuck in a known defect of the client (the worker is left behind)."""
    folder: str = ""

    @property
    def valid(self) -> bool:
        return (
            bool(self.check.get("valid"))
            and not self.unread_keys
            and not any(self.tables.values())
            and self.tables_after_s is not None
            and not self.problems
            and self.compacted.get("valid", True)
        )


def history_run(
    folder: Path,
    seconds: float,
    faults: list[str],
    seed: int,
    *,
    protocol: str | None = None,
    store: str = "sqlite",
    objects: str = "local",
    partitions: int = 4,
    senders: int = 3,
    java_senders: int = 0,
    compacted_senders: int = 0,
    pollers: int = 2,
    transactors: int = 2,
) -> RunResult:
    """Run the workload under ``faults`` for ``seconds``, then check it; the metadata is on
    ``store``: the embedded SQLite, or an etcd or Oxia server started for the run; the objects
    (WAL and tables) on the local disk or, with ``objects="minio"``, on a MinIO of the run's
    own behind a fault proxy."""
    folder.mkdir(parents=True, exist_ok=True)
    protocol = protocol or ("consumer" if seed % 2 else "classic")
    result = RunResult(seed, faults, protocol, store, objects, folder=str(folder))
    with environment(folder, SETTINGS, faults, seed, store, objects) as env:
        running = env.start_brokers(BROKERS)
        settings = env.reader_settings

        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        topics = [NewTopic(TOPIC, partitions, 1)]
        if compacted_senders:
            topics.append(NewTopic(compacted.TOPIC, partitions, 1, config=compacted.TOPIC_CONFIG))
        for created in admin.create_topics(topics).values():
            created.result(30)
        history = History(folder / "history.jsonl")
        client = {
            "bootstrap.servers": running.bootstrap,
            "logger": client_logger(folder / "clients.log"),
        }
        setup = Setup(history, client, TOPIC, partitions, Values())
        workers: list[Worker] = [
            Sender(f"sender-{i}", setup, seed * 100 + i) for i in range(senders)
        ]
        workers += [
            JavaSender(f"java-sender-{i}", setup, seed * 400 + i, i, folder / "java.log")
            for i in range(java_senders)
        ]
        keyed = compacted.CompactedLog(folder / "compacted.jsonl")
        workers += [
            compacted.CompactedSender(f"keyed-sender-{i}", setup, seed * 500 + i, keyed)
            for i in range(compacted_senders)
        ]
        workers += [
            Poller(f"poller-{i}", setup, seed * 200 + i, "pollers", protocol)
            for i in range(pollers)
        ]
        workers += [
            Transactor(f"txn-{seed}-{i}", setup, seed * 300 + i, "transactors", protocol)
            for i in range(transactors)
        ]
        for worker in workers:
            worker.start()
        nemesis = Nemesis(running, env.targets, faults, history, seed)
        nemesis.start()
        time.sleep(seconds)
        nemesis.stop()
        if env.targets.objects is not None:
            env.targets.objects.heal()
        wait_for_brokers(running, BROKERS)
        # Stalls are measured up to here: once told to stop, clients only finish what they do.
        workload_ended = history.now()
        for worker in workers:
            worker.stopping.set()  # all at once: each may take a while to finish its operation
        for worker in workers:
            worker.stop()
        result.seconds = history.now()
        stream, result.unread_keys = final_read(setup)
        if compacted_senders:
            read, stuck = compacted.read_compacted(setup)
            result.compacted = compacted.check_compacted(keyed.close(), read)
            result.compacted["unread_partitions"] = stuck
            result.compacted["valid"] &= not stuck
        path = history.close()
        result.operations = history.operations
        result.clients_replaced = sum(w.replaced for w in workers)
        result.faults = [f.as_json() for f in nemesis.faults]
        result.problems += nemesis.failures + [e for w in workers for e in w.errors]
        result.client_hangs = [h for w in workers for h in w.client_hangs]
        if not nemesis.faults and faults:
            result.problems.append("no fault happened")
        result.check = _check(path)
        _add_stalls(result.faults, path, workload_ended)
        read_at = time.monotonic()
        if caught_up_tables(running, TOPIC, TABLES_GIVE_UP_S, settings):
            result.tables_after_s = round(time.monotonic() - read_at, 1)
        result.tables = check_tables(table_rows(running, TOPIC, settings, *env.readers), stream)
        (folder / "faults.json").write_text(json.dumps(result.faults, indent=1))
    return result


def summary(result: RunResult) -> dict[str, Any]:
    """One run in a line: what it did, each anomaly's count, the longest stall of each kind of
    fault (sends / polls / transaction commits, in seconds) and the tables' verdict."""
    anomalies = result.check.get("anomalies", {})
    stalls: dict[str, list[float]] = {}
    for fault in result.faults:
        worst = stalls.setdefault(fault["kind"], [0.0, 0.0, 0.0])
        for i, f in enumerate(("send", "poll", "txn")):
            worst[i] = max(worst[i], fault.get(f"{f}_stalled_s", 0.0))
    return {
        "valid": result.valid,
        "seed": result.seed,
        "faults": dict(Counter(f["kind"] for f in result.faults)),
        "store": result.store,
        "objects": result.objects,
        "protocol": result.protocol,
        "seconds": round(result.seconds),
        "operations": result.operations,
        "clients_replaced": result.clients_replaced,
        "acknowledged_writes": result.check.get("stats", {}).get("acknowledged_writes"),
        "forbidden": {k: v["count"] for k, v in anomalies.items() if not v["allowed"]},
        "allowed": {k: v["count"] for k, v in anomalies.items() if v["allowed"]},
        "longest_stalls_s": stalls,
        "unread_keys": result.unread_keys,
        "tables_differences": {f: len(d) for f, d in result.tables.items()},
        "compacted": {
            "anomalies": {
                k: v["count"]
                for k, v in result.compacted.get("anomalies", {}).items()
                if v["count"]
            },
            "acknowledged": result.compacted.get("acknowledged", 0),
            "removed_by_compaction": result.compacted.get("removed_by_compaction", 0),
        },
        "tables_after_s": result.tables_after_s,
        "problems": result.problems,
        "client_hangs": len(result.client_hangs),
        "folder": result.folder,
    }


def table_row(summaries: list[dict[str, Any]]) -> str:
    """The runs of one fault mix as a row of docs/reliability.md's results table."""
    faults: Counter[str] = Counter()
    forbidden: Counter[str] = Counter()
    allowed: Counter[str] = Counter()
    stalls: dict[str, list[float]] = {}
    for run in summaries:
        faults.update(run["faults"])
        forbidden.update(run["forbidden"])
        forbidden.update({f"compacted {k}": v for k, v in run["compacted"]["anomalies"].items()})
        allowed.update(run["allowed"])
        for kind, worst in run["longest_stalls_s"].items():
            stalls[kind] = [max(a, b) for a, b in zip(stalls.get(kind, worst), worst, strict=True)]
    caught_up = [r["tables_after_s"] for r in summaries if r["tables_after_s"] is not None]
    tables_equal = sum(
        1
        for r in summaries
        if not any(r["tables_differences"].values()) and r["tables_after_s"] is not None
    )

    def counts(counter: Counter[str]) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(counter.items()) if v) or "0"

    first = summaries[0]
    hangs = sum(r.get("client_hangs", 0) for r in summaries)
    cells = [
        counts(faults),
        f"{first['store']}, {first['objects']}",
        f"{sum(1 for r in summaries if r['valid'])} of {len(summaries)}"
        + (f" ({hangs} client hangs)" if hangs else ""),
        f"{sum(r['seconds'] for r in summaries):,}",
        f"{sum(r['operations'] for r in summaries):,}",
        f"{sum(r['acknowledged_writes'] or 0 for r in summaries):,} + "
        f"{sum(r['compacted']['acknowledged'] for r in summaries):,} keyed "
        f"({sum(r['compacted']['removed_by_compaction'] for r in summaries):,} compacted away)",
        counts(forbidden),
        counts(allowed),
        "; ".join(f"{k} {' / '.join(f'{s:.1f}' for s in v)}" for k, v in sorted(stalls.items())),
        f"equal in {tables_equal} of {len(summaries)}, caught up in at most "
        f"{max(caught_up, default=0):.0f} s",
    ]
    return "| " + " | ".join(cells) + " |"


def _check(path: Path) -> dict[str, Any]:
    return check(load(path)).to_dict()


def _add_stalls(faults: list[dict[str, Any]], path: Path, workload_ended: float) -> None:
    """Per fault: the longest time within it (and ``STALL_AFTER_S`` after it, while the
    clients ran and no other fault began) in which no send was acknowledged, no poll returned
    a record, and no transaction committed."""
    done: dict[str, list[float]] = {"send": [], "poll": [], "txn": []}
    with path.open() as history:
        for line in history:
            event = json.loads(line)
            if event["type"] != "ok" or event["f"] not in done:
                continue
            if event["f"] == "poll" and not any(reads for _, reads in event["value"]):
                continue
            done[event["f"]].append(event["time"])
    for fault, following in zip(faults, [*faults[1:], None], strict=True):
        # Up to the next fault at most: a stall there is that fault's.
        start = fault["began"]
        end = min(fault["ended"] + STALL_AFTER_S, workload_ended)
        if following is not None:
            end = min(end, max(following["began"], fault["ended"]))
        for f, times in done.items():
            inside = [start] + [t for t in times if start < t < end] + [end]
            fault[f"{f}_stalled_s"] = round(max(b - a for a, b in itertools.pairwise(inside)), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.history.run",
        description="Record and check client histories under faults.",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=5.0, help="faults per run")
    parser.add_argument(
        "--faults", default="kill,pause", help=f"comma-separated, of: {', '.join(KINDS)}"
    )
    parser.add_argument("--seed", type=int, default=1, help="of the first run; then +1")
    parser.add_argument("--protocol", choices=["classic", "consumer"], help="default: by seed")
    parser.add_argument(
        "--store",
        choices=STORE_CHOICES,
        default="sqlite",
        help="etcd3: a three-member etcd cluster, for leader-* faults",
    )
    parser.add_argument(
        "--objects",
        choices=OBJECT_CHOICES,
        default="local",
        help="where the WAL and tables are (minio: behind a fault proxy, for objects-* faults)",
    )
    parser.add_argument(
        "--java-senders", type=int, default=1, help="idempotent producers of Kafka's Java client"
    )
    parser.add_argument(
        "--compacted-senders",
        type=int,
        default=1,
        help="producers of keyed records to a compacted topic, checked on their own",
    )
    parser.add_argument("--folder", type=Path, help="default: a new temporary folder")
    args = parser.parse_args(argv)
    folder = args.folder or Path(tempfile.mkdtemp(prefix="icefloe-histories-"))
    print(f"histories, faults and logs: {folder}", file=sys.stderr)
    unknown = set(args.faults.split(",")) - set(KINDS)
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    all_valid = True
    summaries = []
    for n in range(args.runs):
        seed = args.seed + n
        run_folder = folder / f"run-{seed}"
        faults = args.faults.split(",")
        result = history_run(
            run_folder,
            args.minutes * 60,
            faults,
            seed,
            protocol=args.protocol,
            store=args.store,
            objects=args.objects,
            java_senders=args.java_senders,
            compacted_senders=args.compacted_senders,
        )
        all_valid &= result.valid
        full = {**asdict(result), "valid": result.valid}
        (run_folder / "result.json").write_text(json.dumps(full, indent=1))
        summaries.append(summary(result))
        print(json.dumps(summaries[-1]), flush=True)
    print(table_row(summaries), flush=True)
    return 0 if all_valid else 1


if __name__ == "__main__":
    sys.exit(main())
