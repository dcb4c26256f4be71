"""Exactly-once with consumer groups under minutes of random faults: a transactional
consume-transform-produce pipeline of confluent-kafka members of one group (see
tests/support/eos_worker.py) on a three-broker `icefloe serve`, while members join, leave
(SIGTERM), die (SIGKILL; half of them replaced by an instance with the same transactional id,
the others' transactions left to time out) and pause past their session (SIGSTOP, then SIGCONT),
and the oldest broker is SIGKILLed every 10-15 s (`serve` starts it again a second later).
At the end every input must have come out exactly once, read with read_committed.

    .venv/bin/python -m tests.chaos.eos_pipeline --minutes 5 --protocol consumer --seed 1

Prints what it did and the tally; exits 1 unless the outputs hold each input exactly once,
and then why, per input partition (tests/support/eos_diagnosis.py): inputs never processed
(the pipeline stalled), or committed without their outputs, or whose committed outputs the
read_committed read missed. ``--debug eos,cgrp,topic`` writes the members' librdkafka debug
lines to their logs (with ``--keep``). The short version is in the suite
(tests/integration/test_eos_pipeline.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.broker import broker_pids, start_icefloe
from tests.support.eos_diagnosis import diagnose
from tests.support.eos_pipeline import (
    InputFeed,
    PipelineWorker,
    read_committed,
    tally,
    wait_until_consumed,
)
from tests.support.group_members import BROKER_ENV

IN_PARTITIONS = 6
OUT_PARTITIONS = 3
PAUSE_S = (7.0, 10.0)
"""Longer than the members' 6 s session: the group moves a paused member's partitions."""


class Chaos:
    def __init__(self, args: argparse.Namespace, bootstrap: str, log_dir: Path) -> None:
        self.args = args
        self.random = random.Random(args.seed)
        self.bootstrap = bootstrap
        self.log_dir = log_dir
        self.topics = ("chaos-in", "chaos-out")
        self.workers: list[PipelineWorker] = []
        self.faults: Counter[str] = Counter()
        self.names = 0
        self.timers: list[threading.Timer] = []
        self.replacements: list[str] = []
        self.paused: list[PipelineWorker] = []
        self.leaving: list[PipelineWorker] = []
        """Transactional ids of killed members to start again."""
        self.started = time.monotonic()

    def say(self, what: str) -> None:
        print(f"{time.monotonic() - self.started:7.1f}s  {what}", flush=True)

    def start(self, transactional_id: str | None = None) -> PipelineWorker:
        if transactional_id is None:
            self.names += 1
            transactional_id = f"member-{self.names}"
        worker = PipelineWorker(
            self.bootstrap,
            "chaos",
            transactional_id,
            self.args.protocol,
            self.topics,
            self.log_dir,
        )
        self.workers.append(worker.start())
        return worker

    def live(self) -> list[PipelineWorker]:
        return [w for w in self.workers if w.alive() and w not in self.leaving]

    def steady(self) -> list[PipelineWorker]:
        """Live members neither paused nor leaving: those a fault may hit."""
        return [w for w in self.live() if w not in self.paused]

    def act(self) -> None:
        """One random fault among the members."""
        while self.replacements:
            self.start(self.replacements.pop())
        live = self.steady()
        action = self.random.choice(["join", "leave", "kill", "pause"])
        if action == "join" or len(live) < 3:
            worker = self.start()
            self.faults["joined"] += 1
            self.say(f"{worker.transactional_id} joins")
            return
        victim = self.random.choice(live)
        if action == "leave":
            self.faults["left"] += 1
            self.say(f"{victim.transactional_id} leaves")
            self.leaving.append(victim)
            threading.Thread(target=victim.stop, daemon=True).start()
        elif action == "kill":
            victim.kill()
            self.faults["killed"] += 1
            if self.random.random() < 0.5:
                # Started from this thread: a member dies with the thread that started it.
                self.replacements.append(victim.transactional_id)
                self.say(f"{victim.transactional_id} killed; replaced at the next step")
            else:
                self.say(f"{victim.transactional_id} killed; its transaction left to time out")
        else:
            victim.signal(signal.SIGSTOP)
            pause = self.random.uniform(*PAUSE_S)
            self.faults["paused"] += 1
            self.paused.append(victim)

            def resume() -> None:
                if victim.alive():
                    victim.signal(signal.SIGCONT)
                self.paused.remove(victim)

            self.later(pause, resume)
            self.say(f"{victim.transactional_id} paused for {pause:.1f} s")

    def later(self, delay: float, action: object) -> None:
        timer = threading.Timer(delay, action)  # type: ignore[arg-type]
        timer.daemon = True
        timer.start()
        self.timers.append(timer)


def _started(pid: int) -> int:
    """When the process started (clock ticks since boot)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def run(args: argparse.Namespace) -> int:
    folder = tempfile.mkdtemp(prefix="icefloe-eos-chaos-")
    print(f"members' logs and events: {folder}", flush=True)
    try:
        return _run(args, folder)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def _run(args: argparse.Namespace, folder: str) -> int:
    env = dict(BROKER_ENV) | {"ICEFLOE_STORAGE__PRODUCER_LEASE_S": "3"}
    cluster = start_icefloe(Path(folder) / "data", brokers=3, env=env, yielding=True)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        new = [NewTopic("chaos-in", IN_PARTITIONS), NewTopic("chaos-out", OUT_PARTITIONS)]
        for future in admin.create_topics(new).values():
            future.result(30)
        chaos = Chaos(args, cluster.bootstrap, Path(folder))
        for _ in range(3):
            chaos.start()
        seconds = args.minutes * 60
        feed = InputFeed(cluster.bootstrap, "chaos-in", args.inputs, IN_PARTITIONS, seconds)
        feed.start()
        next_broker_kill = time.monotonic() + chaos.random.uniform(10, 15)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(chaos.random.uniform(2, 5))
            chaos.act()
            if args.broker_kills and time.monotonic() >= next_broker_kill:
                victims = broker_pids(cluster)
                if victims:
                    os.kill(min(victims, key=_started), signal.SIGKILL)
                    chaos.faults["broker killed"] += 1
                    chaos.say(f"the oldest broker killed ({len(victims)} were up)")
                next_broker_kill = time.monotonic() + chaos.random.uniform(10, 15)
        chaos.say("faults over; waiting for the pipeline to catch up")
        faults_over = time.monotonic()
        for timer in chaos.timers:
            timer.join()
        while chaos.replacements:
            chaos.start(chaos.replacements.pop())
        feed.join()
        if feed.error:
            print(feed.error)
            return 1
        if len(chaos.live()) < 2:
            chaos.start()
        stalled = None
        try:
            wait_until_consumed(cluster.bootstrap, "chaos", "chaos-in", IN_PARTITIONS, 600)
        except AssertionError as exc:  # the report below says where
            stalled = str(exc)
        caught_up = time.monotonic()
        chaos.say("caught up" if stalled is None else f"stalled: {stalled}")
        for worker in chaos.live():
            worker.stop()
        values = read_committed(cluster.bootstrap, "chaos-out", OUT_PARTITIONS, 600)
    finally:
        cluster.stop()
    counted = tally(values, args.inputs)
    if not (counted.exactly_once and counted.outputs == args.inputs) or stalled:
        topics = ("chaos-in", "chaos-out")
        print(diagnose(cluster.data_dir, topics, "chaos", args.inputs, values, chaos.workers))
    endings: Counter[str] = Counter()
    for worker in chaos.workers:
        for event in worker.events:
            if event["event"] in ("aborted", "new-producer"):
                endings[f"{event['event']} {event['error']}"] += 1
            elif event["event"] == "committed":
                endings["committed"] += 1
    summary = {
        "protocol": args.protocol,
        "seed": args.seed,
        "minutes": args.minutes,
        "inputs": args.inputs,
        "outputs": counted.outputs,
        "missing": len(counted.missing),
        "repeated": len(counted.repeated),
        "faults": dict(chaos.faults),
        "members": len(chaos.workers),
        "members_ended_badly": {
            f"{w.transactional_id} (pid {w.pid})": w.ending()
            for w in chaos.workers
            if not (w.killed or w.hung_closing) and w.exit_code() not in (0, None)
        },
        "closes_outlasting_30s": sum(w.hung_closing for w in chaos.workers),
        "catch_up_s": round(caught_up - faults_over),
        "transactions": dict(endings),
        "elapsed_s": round(time.monotonic() - chaos.started),
    }
    print(json.dumps(summary))
    return 0 if counted.exactly_once and counted.outputs == args.inputs and not stalled else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--inputs", type=int, default=10_000)
    parser.add_argument("--protocol", choices=["classic", "consumer"], default="consumer")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-broker-kills", dest="broker_kills", action="store_false", help="members only"
    )
    parser.add_argument("--keep", action="store_true", help="keep the members' logs and events")
    parser.add_argument("--debug", help="librdkafka debug contexts for the members' logs")
    args = parser.parse_args()
    if args.debug:
        os.environ["ICEFLOE_EOS_DEBUG"] = args.debug  # the members inherit it
    sys.exit(run(args))


if __name__ == "__main__":
    main()
