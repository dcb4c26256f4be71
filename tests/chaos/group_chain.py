"""A chain of consumer groups run again and again, with broker SIGKILLs and CPU load.

    .venv/bin/python -m tests.chaos.group_chain --runs 20 --kill-every 10-15 --load 1

Each run starts three brokers (one `icefloe serve` each, on one data folder, so that one can
be killed and started again on its port) and the chain of tests/support/group_chain.py:
``--groups`` groups, group i consuming topic i and producing to topic i + 1, with two to
three members each joining and leaving all along. The groups' kinds (``--flavours``: classic
range, roundrobin and cooperative-sticky, KIP-848 uniform and range) go round, shifted by one
each run, so every kind meets every position. Every ``--kill-every`` seconds (a range: a
random pause in it) one broker's process group is SIGKILLed and started again at once.
``--load N`` keeps N processes spinning on the CPU meanwhile.

A run passes when every record reached the last topic within ``--deadline`` seconds and no
record arrived more often than uncommitted processing explains. A failed run prints what was
stuck (tests/support/group_chain.py's report) and keeps its folder. The end prints a table:
runs, passes, seconds, duplicates and kills, per run and in all. Exits non-zero if a run
failed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.broker import RunningIcefloe, start_icefloe
from tests.support.group_chain import (
    FLAVOURS,
    Chain,
    Sink,
    Source,
    await_records,
    churn,
    hop_report,
    stall_report,
    unexplained_copies,
)
from tests.support.group_members import BROKER_ENV
from tests.support.servers import free_port
from tests.support.topics import create_topic

BROKERS = 3


@dataclass
class RunResult:
    flavours: list[str]
    passed: bool
    seconds: float
    duplicates: int
    kills: int
    changes: int


class Brokers:
    """Three `icefloe serve` processes on one data folder, each in a process group of its own."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        env = {**BROKER_ENV, "ICEFLOE_BROKER__SESSION_TTL_S": "5"}
        self.env = env
        self.running: list[RunningIcefloe] = []
        for _ in range(BROKERS):
            port = _free_port()
            self.running.append(self._start(port))
        self.kills = 0

    def _start(self, port: int) -> RunningIcefloe:
        return start_icefloe(self.data_dir, env=self.env, own_session=True, port=port)

    @property
    def addresses(self) -> list[str]:
        return [r.bootstrap for r in self.running]

    def kill_one(self, rng: random.Random) -> str:
        """SIGKILL one broker's `serve` with its broker and compactor, then start it again."""
        index = rng.randrange(len(self.running))
        victim = self.running[index]
        os.killpg(victim.process.pid, signal.SIGKILL)
        status = victim.process.wait(10)
        assert status == -signal.SIGKILL, f"the broker on port {victim.port} exited {status}"
        self.kills += 1
        self.running[index] = self._start(victim.port)
        return f"killed and restarted the broker on port {victim.port}"

    def stop(self) -> None:
        for running in self.running:
            running.stop()


def _free_port() -> int:
    while True:
        port = free_port()
        if port < 65000:
            return port


def one_run(number: int, flavours: list[str], args: argparse.Namespace, folder: Path) -> RunResult:
    rng = random.Random(args.seed + number)
    brokers = Brokers(folder / "data")
    topics = [f"chain-{i}" for i in range(args.groups + 1)]
    changes: list[str] = []
    try:
        for topic in topics:
            create_topic(brokers.running[0], topic, args.partitions)
        chain = Chain(
            bootstrap=brokers.addresses,
            data_dir=folder / "data",
            topics=topics,
            groups=[f"g{i}" for i in range(args.groups)],
            flavours=flavours,
            partitions=args.partitions,
            auto_commit=[i % 2 == 1 for i in range(args.groups)],
        )
        sink = Sink(",".join(brokers.addresses), topics[-1], args.partitions).start()
        for index in range(args.groups):
            chain.add_member(index)
            chain.add_member(index)
        Source(",".join(brokers.addresses), topics[0], args.records, args.seconds).start()
        low, high = args.kill_every
        next_kill = rng.uniform(low, high) if high else float("inf")
        next_change = args.churn_every

        def faults(elapsed: float) -> bool:
            nonlocal next_kill, next_change
            if elapsed >= next_kill:
                print(f"  {elapsed:6.1f}s {brokers.kill_one(rng)}", flush=True)
                next_kill = elapsed + rng.uniform(low, high)
            if elapsed >= next_change and elapsed < args.seconds:
                changes.append(churn(chain, len(changes)))
                print(f"  {elapsed:6.1f}s {changes[-1]}", flush=True)
                next_change = elapsed + args.churn_every
            return elapsed < args.seconds

        outcome = await_records(sink, args.records, args.seconds + args.deadline, faults)
        report = stall_report(chain, outcome) if outcome.missing else ""
        chain.stop()
        sink.stop()
        twice = unexplained_copies(chain, sink)
        failures = chain.failures()
        passed = not outcome.missing and not twice and not failures
        if report:
            print(report, flush=True)
        if twice:
            print(f"{len(twice)} records arrived more often than uncommitted processing explains")
            print(hop_report(chain, twice), flush=True)
        if failures:
            print(f"members failed: {failures}", flush=True)
        if not passed:
            for member in chain.everyone():
                log = folder / f"{member.name}.log"
                log.write_text("\n".join([*member.events, *member.log.lines]))
            print(f"each member's events and debug log are in {folder}", flush=True)
        return RunResult(
            flavours, passed, outcome.seconds, outcome.duplicates, brokers.kills, len(changes)
        )
    finally:
        brokers.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--records", type=int, default=6000)
    parser.add_argument("--seconds", type=float, default=60, help="the source's duration")
    parser.add_argument("--deadline", type=float, default=120, help="seconds after the source")
    parser.add_argument("--churn-every", type=float, default=3.0)
    parser.add_argument(
        "--kill-every", default="10-15", help="seconds between broker kills (LOW-HIGH; 0: none)"
    )
    parser.add_argument("--load", type=int, default=0, help="processes spinning on the CPU")
    parser.add_argument("--flavours", default=",".join(FLAVOURS))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    low, _, high = args.kill_every.partition("-")
    args.kill_every = (float(low), float(high or low))
    kinds = args.flavours.split(",")
    unknown = set(kinds) - FLAVOURS.keys()
    if unknown:
        parser.error(f"unknown flavours {sorted(unknown)}; choose among {sorted(FLAVOURS)}")

    spinners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)
    ]
    results: list[RunResult] = []
    try:
        for number in range(args.runs):
            flavours = [kinds[(number + i) % len(kinds)] for i in range(args.groups)]
            folder = Path(tempfile.mkdtemp(prefix=f"group-chain-{number}-"))
            print(f"run {number}: {', '.join(flavours)} in {folder}", flush=True)
            result = one_run(number, flavours, args, folder)
            results.append(result)
            if result.passed:
                shutil.rmtree(folder, ignore_errors=True)
            print(
                f"run {number}: {'passed' if result.passed else 'FAILED'} in "
                f"{result.seconds:.1f} s, {result.duplicates} duplicates, {result.kills} kills, "
                f"{result.changes} membership changes",
                flush=True,
            )
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    passed = sum(r.passed for r in results)
    print(
        f"\n{passed} of {len(results)} runs passed; seconds "
        f"{min(r.seconds for r in results):.1f}-{max(r.seconds for r in results):.1f}; "
        f"duplicates {sum(r.duplicates for r in results)} in all "
        f"(at most {max(r.duplicates for r in results)} in a run); "
        f"{sum(r.kills for r in results)} broker kills"
    )
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
