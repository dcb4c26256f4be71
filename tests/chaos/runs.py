"""One chaos round: a 3-broker cluster, idempotent producers and a consumer group, brokers
SIGKILLed every 10-15 s (and, once, every process of the cluster at once), then the checks of
:mod:`tests.support.chaos`. The suite runs a short round; ``python -m tests.chaos`` long ones."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import RunningIcefloe, broker_pids, child_pids, start_icefloe
from tests.support.chaos import (
    BrokerKiller,
    GroupReaders,
    IdempotentLoad,
    Kill,
    StoreFaults,
    Verdict,
    caught_up_tables,
    check_group,
    check_stream,
    check_tables,
    client_logger,
    read_stream,
    redeliveries,
    table_rows,
    wait_for_brokers,
)
from tests.support.metadata_servers import MetadataServer, start_etcd, start_oxia

BROKERS = 3
TOPIC = "chaos"
KILL_EVERY = (10.0, 15.0)
TABLES_WITHIN_S = 60.0
"""Both tables hold every record within this long of the last fault."""
TABLES_GIVE_UP_S = 300.0
"""How long a round waits for the tables at most (to say how late they were)."""
QUICK_COMPACTION = {
    # Tables close behind the stream, so that "caught up within a minute" is a real check.
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "5",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "1",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "1",
}


@dataclass
class RoundResult:
    """What one round did and found."""

    seed: int
    folder: Path
    protocol: str
    seconds: float = 0.0
    kills: list[Kill] = field(default_factory=list)
    acknowledged: int = 0
    failed: int = 0
    stream: Verdict = field(default_factory=Verdict)
    never_handed: list[str] = field(default_factory=list)
    redelivered: int = 0
    redelivered_runs: list[str] = field(default_factory=list)
    tables: dict[str, list[str]] = field(default_factory=dict)
    tables_after_s: float = 0.0
    """When both tables held every record, counted from the last fault."""
    phases: dict[str, float] = field(default_factory=dict)
    """Seconds each step after the faults took: the producers' last answers, the group's and
    the tables' catching up."""
    other: list[str] = field(default_factory=list)
    """Failures of the run itself: a producer failed for good, records without an outcome, a
    kill that did not happen, a client's fatal error."""

    @property
    def broker_kills(self) -> int:
        return sum(k.what == "broker" for k in self.kills)

    @property
    def store_faults(self) -> int:
        return sum(k.what.endswith(("killed", "paused")) for k in self.kills)

    @property
    def problems(self) -> list[str]:
        return (
            self.stream.problems
            + [f"the group was never handed {m}" for m in self.never_handed]
            + [f"{f}: {p}" for f, ps in self.tables.items() for p in ps]
            + self.other
        )

    def summary(self) -> str:
        text = (
            f"round {self.seed} ({self.protocol} group, {self.folder}): {self.seconds:.0f} s, "
            f"{self.broker_kills} broker kills, "
            f"{sum(k.what == 'cluster' for k in self.kills)} cluster kills, "
            f"{self.store_faults} metadata store kills and pauses, "
            f"{self.acknowledged} records acknowledged, {self.failed} failed; "
            f"stream: {self.stream.summary()}; group: {len(self.never_handed)} never handed, "
            f"{self.redelivered} redelivered; tables: "
            + ", ".join(f"{f} {len(ps)} differences" for f, ps in self.tables.items())
            + f", caught up {self.tables_after_s:.0f} s after the last fault"
            + "; after the faults: "
            + ", ".join(f"{step} {s:.0f} s" for step, s in self.phases.items())
        )
        if self.problems:
            text += "\n  " + "\n  ".join(self.problems[:40])
        if self.redelivered_runs:
            text += "\n  kills at " + ", ".join(f"{k.at:.0f} s ({k.what})" for k in self.kills)
            text += "\n  redelivered: " + "\n  redelivered: ".join(self.redelivered_runs[:10])
        return text


def broker_kill_round(
    folder: Path,
    seconds: float,
    seed: int,
    *,
    partitions: int = 6,
    producers: int = 2,
    rate: float = 150.0,
    kill_everything_once: bool = True,
    kill_brokers: bool = True,
    store: str = "sqlite",
    store_faults: bool = False,
    group_protocol: str | None = None,
    env: dict[str, str] | None = None,
) -> RoundResult:
    """Run the faults for ``seconds``, then check the stream, the group and both tables.

    The metadata is on ``store``: the embedded SQLite, or an etcd or Oxia server started for
    the round, which ``store_faults`` kills and pauses in turn every 20-30 s.
    """
    folder.mkdir(parents=True, exist_ok=True)
    server = None if store == "sqlite" else STORES[store](folder / store)
    environment = {**QUICK_COMPACTION, **store_settings(store, server), **(env or {})}
    protocol = group_protocol or ("consumer" if seed % 2 else "classic")
    result = RoundResult(seed, folder, protocol)
    running = start_icefloe(folder / "data", brokers=BROKERS, env=environment)
    started = time.monotonic()
    faults = None
    if server is not None and store_faults:
        faults = StoreFaults(server.process, STORE_FAULT_EVERY, started, seed)
        faults.start()
    try:
        admin = AdminClient({"bootstrap.servers": running.bootstrap})
        admin.create_topics([NewTopic(TOPIC, partitions, 1)])[TOPIC].result(30)
        logger = client_logger(folder / "clients.log")
        loads = [
            IdempotentLoad(
                running.bootstrap,
                TOPIC,
                partitions,
                f"p{i}",
                rate / producers,
                logger,
                {"debug": "eos,msg"},
            )
            for i in range(producers)
        ]
        readers = GroupReaders(running.bootstrap, TOPIC, "chaos-readers", 3, protocol, logger)
        for load in loads:
            load.start()
        readers.start()
        stretches = [seconds / 2, seconds / 2] if kill_everything_once else [seconds]
        for n, length in enumerate(stretches):
            killer = BrokerKiller(running, KILL_EVERY, started, seed * 100 + n)
            if kill_brokers:
                killer.start()
            time.sleep(length)
            if kill_brokers:
                killer.stop()
            result.kills += killer.kills
            result.other += killer.failures
            if n < len(stretches) - 1:
                at = time.monotonic() - started
                running = _kill_everything(running, folder, environment)
                result.kills.append(Kill(at, running.process.pid, "cluster"))
                result.phases["cluster restart"] = time.monotonic() - started - at
        if faults is not None:
            faults.stop()
            result.kills += faults.kills
            result.other += faults.failures
        wait_for_brokers(running, BROKERS)
        last_fault = step = time.monotonic()

        def took(name: str) -> None:
            nonlocal step
            result.phases[name] = time.monotonic() - step
            step = time.monotonic()

        for load in loads:
            load.stop()
        took("producers")
        stream = read_stream(running.bootstrap, TOPIC, partitions)
        took("read back")
        _wait_for_group(readers, stream, within=60)
        readers.stop()
        took("group")
        result.stream = check_stream(stream, loads)
        result.never_handed, result.redelivered = check_group(readers, stream)
        result.redelivered_runs = redeliveries(readers)
        caught_up = caught_up_tables(running, TOPIC, TABLES_GIVE_UP_S, environment)
        took("tables")
        result.tables_after_s = time.monotonic() - last_fault
        if not caught_up:
            result.other.append(f"the tables had not caught up {TABLES_GIVE_UP_S:.0f} s on")
        elif result.tables_after_s > TABLES_WITHIN_S:
            result.other.append(
                f"the tables caught up {result.tables_after_s:.0f} s after the last fault, "
                f"more than {TABLES_WITHIN_S:.0f} s"
            )
        result.tables = check_tables(table_rows(running, TOPIC, environment), stream)
    finally:
        if faults is not None and faults.is_alive():
            faults.stop()
        stopping = time.monotonic()
        running.stop()
        result.phases["stop"] = time.monotonic() - stopping
        if server is not None:
            server.process.stop()
    result.seconds = time.monotonic() - started
    result.acknowledged = sum(len(load.outcomes.acked) for load in loads)
    result.failed = sum(len(load.outcomes.failed) for load in loads)
    result.other += [f"a producer failed for good: {load.fatal}" for load in loads if load.fatal]
    unfinished = sum(load.unfinished for load in loads)
    if unfinished:
        result.other.append(f"{unfinished} records had no outcome")
    result.other += readers.errors
    return result


STORES = {"etcd": start_etcd, "oxia": start_oxia}
STORE_FAULT_EVERY = (20.0, 30.0)


def store_settings(store: str, server: MetadataServer | None) -> dict[str, str]:
    """What points ``serve`` at the round's metadata store."""
    if server is None:
        return {}
    key = {"etcd": "ETCD__ENDPOINTS", "oxia": "OXIA__ADDRESSES"}[store]
    return {"ICEFLOE_METADATA__BACKEND": store, f"ICEFLOE_METADATA__{key}": f'["{server.address}"]'}


def _kill_everything(running: RunningIcefloe, folder: Path, env: dict[str, str]) -> RunningIcefloe:
    """SIGKILL serve and every process under it at once (a host's crash), then start the
    cluster again on the same data and ports."""
    pids = [running.process.pid]
    for broker in broker_pids(running):
        pids += [broker, *child_pids(broker)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    running.process.wait()
    running.log_path.rename(running.log_path.with_name(f"{running.log_path.stem}-killed.log"))
    return start_icefloe(folder / "data", brokers=BROKERS, env=env, port=running.port)


def _wait_for_group(
    readers: GroupReaders, stream: dict[int, list[tuple[int, str]]], within: float
) -> None:
    """Wait until the group has been handed every record of the stream, or ``within`` s."""
    wanted = {name for records in stream.values() for _, name in records}
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if wanted <= {h.name for h in list(readers.seen)}:
            return
        time.sleep(1)
