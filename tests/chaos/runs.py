"""One chaos round: a 3-broker cluster, idempotent producers and a consumer group, brokers
SIGKILLed every 10-15 s (and, once, every process of the cluster at once), then the checks of
:mod:`tests.support.chaos`. The suite runs short rounds; ``python -m tests.chaos`` long ones."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import RunningIcefloe, broker_pids, child_pids, start_icefloe
from tests.support.chaos import (
    BrokerKiller,
    GroupReaders,
    IdempotentLoad,
    Kill,
    check_group,
    check_stream,
    check_tables,
    client_logger,
    read_stream,
    table_rows,
    wait_for_brokers,
)

BROKERS = 3
TOPIC = "chaos"
KILL_EVERY = (10.0, 15.0)
TABLES_WITHIN_S = 60.0
"""Both tables hold every record within this long of the last fault."""
QUICK_COMPACTION = {
    # Tables close behind the stream, so that "caught up within a minute" is a real check.
    "ICEFLOE_COMPACTOR__MAX_AGE_S": "5",
    "ICEFLOE_COMPACTOR__MIN_AGE_S": "1",
    "ICEFLOE_COMPACTOR__INTERVAL_S": "1",
}


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    passed: bool
    text: str


def broker_kill_round(
    folder: Path,
    seconds: float,
    seed: int,
    *,
    partitions: int = 6,
    producers: int = 2,
    rate: float = 150.0,
    kill_everything_once: bool = True,
    group_protocol: str | None = None,
    env: dict[str, str] | None = None,
) -> RoundOutcome:
    """Run the faults for ``seconds``, then check the stream, the group and both tables."""
    folder.mkdir(parents=True, exist_ok=True)
    environment = {**QUICK_COMPACTION, **(env or {})}
    running = start_icefloe(folder / "data", brokers=BROKERS, env=environment)
    protocol = group_protocol or ("consumer" if seed % 2 else "classic")
    started = time.monotonic()
    kills: list[Kill] = []
    failures: list[str] = []
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
        halves = [seconds / 2, seconds / 2] if kill_everything_once else [seconds]
        for n, length in enumerate(halves):
            killer = BrokerKiller(running, KILL_EVERY, started, seed * 100 + n)
            killer.start()
            time.sleep(length)
            killer.stop()
            kills += killer.kills
            failures += killer.failures
            if n < len(halves) - 1:
                running = _kill_everything(running, folder, environment)
                kills.append(Kill(time.monotonic() - started, running.process.pid, "cluster"))
        wait_for_brokers(running, BROKERS)
        last_fault = time.monotonic()
        for load in loads:
            load.stop()
        stream = read_stream(running.bootstrap, TOPIC, partitions)
        _wait_for_group(readers, stream, within=60)
        readers.stop()
        verdict = check_stream(stream, loads)
        missed, redelivered = check_group(readers, stream)
        tables = table_rows(running, TOPIC, TABLES_WITHIN_S - (time.monotonic() - last_fault))
        table_problems = check_tables(tables, stream)
    finally:
        running.stop()
    acked = sum(len(load.outcomes.acked) for load in loads)
    failed = sum(len(load.outcomes.failed) for load in loads)
    fatal = [load.fatal for load in loads if load.fatal]
    unfinished = sum(load.unfinished for load in loads)
    problems = (
        verdict.problems
        + [f"the group was never handed {m}" for m in missed]
        + [f"{f}: {p}" for f, ps in table_problems.items() for p in ps]
        + [f"a producer failed for good: {f}" for f in fatal]
        + [f"{unfinished} records had no outcome"] * bool(unfinished)
        + readers.errors
        + failures
    )
    text = (
        f"round {seed} ({protocol} group, {folder}): {time.monotonic() - started:.0f} s, "
        f"{sum(k.what == 'broker' for k in kills)} broker kills, "
        f"{sum(k.what == 'cluster' for k in kills)} cluster kills, "
        f"{acked} records acknowledged, {failed} failed; stream: {verdict.summary()}; "
        f"group: {len(missed)} never handed, {redelivered} redelivered; tables: "
        + ", ".join(f"{f} {len(ps)} differences" for f, ps in table_problems.items())
    )
    if problems:
        text += "\n  " + "\n  ".join(problems[:40])
    return RoundOutcome(not problems and bool(kills), text)


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
    return start_icefloe(folder / "data", brokers=BROKERS, env=env, port=running.port)


def _wait_for_group(
    readers: GroupReaders, stream: dict[int, list[tuple[int, str]]], within: float
) -> None:
    """Wait until the group has been handed every record of the stream, or ``within`` s."""
    wanted = {name for records in stream.values() for _, name in records}
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if wanted <= {name for name, _, _ in list(readers.seen)}:
            return
        time.sleep(1)
