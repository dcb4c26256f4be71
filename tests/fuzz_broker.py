"""Long fuzz runs against `icefloe serve`, by hand: millions of hostile frames, then a report.

    .venv/bin/python -m tests.fuzz_broker --frames 1000000 --brokers 2

Starts `icefloe serve --brokers N` in a temporary folder (embedded backends), creates a topic
the fuzzer never names and fills it, then sends ``--frames`` frames from
``tests/support/fuzz.py`` spread over every broker, in rounds so that progress shows. Reports
broker deaths (restarts `serve` performed), the bystander's latency, the brokers' peak RSS
(the kernel's high-water mark, VmHWM) and whether the untouched topic's records are unchanged.
Exits non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

from tests.support.broker import RunningIcefloe, broker_pids, start_icefloe, unhandled_errors
from tests.support.fuzz import FrameSource, FuzzReport, fuzz
from tests.support.kafka_wire import KafkaWire, batch_of, produce_request
from tests.support.topics import create_topic, stored_records

PRECIOUS = "precious"
PLAYGROUND = ("fuzz-a", "fuzz-b")
NAMES = (*PLAYGROUND, "fuzz-group", "fuzz-txn", "consumer", "range", "uniform")
ROUND = 50_000


def peak_rss_mib(pids: list[int]) -> dict[int, float]:
    """Each process's peak resident memory so far (VmHWM), in MiB."""
    peaks = {}
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peaks[pid] = int(line.split()[1]) / 1024
    return peaks


def fill(running: RunningIcefloe) -> list[list[object]]:
    create_topic(running, PRECIOUS, 3)
    for topic in PLAYGROUND:
        create_topic(running, topic, 3)
    with KafkaWire(running.bootstrap) as wire:
        for partition in range(3):
            for n in range(20):
                batch = batch_of([b"record %d-%d" % (n, i) for i in range(50)])
                wire.request(produce_request(PRECIOUS, partition, batch))
    return [list(stored_records(running, PRECIOUS, p)) for p in range(3)]


async def run_round(running: RunningIcefloe, frames: FrameSource, count: int) -> FuzzReport:
    per_broker = count // running.brokers
    reports = await asyncio.gather(
        *(
            fuzz(
                running.host,
                running.port + i,
                frames,
                count=per_broker,
                connections=8,
                bystander_topic=PRECIOUS,
            )
            for i in range(running.brokers)
        )
    )
    total = FuzzReport()
    for report in reports:
        total.add(report)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--brokers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="icefloe-fuzz-") as folder:
        running = start_icefloe(Path(folder) / "data", brokers=args.brokers)
        try:
            before = fill(running)
            brokers = broker_pids(running)
            frames = FrameSource(args.seed, NAMES, PLAYGROUND)
            total = FuzzReport()
            started = time.monotonic()
            while total.sent < args.frames:
                count = min(ROUND, args.frames - total.sent)
                total.add(asyncio.run(run_round(running, frames, count)))
                print(
                    f"{total.sent:>9} sent, {total.handled} handled, "
                    f"{time.monotonic() - started:.0f} s; bystander p99 "
                    f"{total.bystander_p99_s * 1000:.1f} ms, "
                    f"max {total.bystander_max_s * 1000:.1f} ms",
                    flush=True,
                )
            peaks = peak_rss_mib(broker_pids(running))
            deaths = running.log_path.read_text(errors="replace").count("exited (status")
            unchanged = [list(stored_records(running, PRECIOUS, p)) for p in range(3)] == before
            survivors = broker_pids(running) == brokers
        finally:
            running.stop()
        unhandled = len(unhandled_errors(running.log_path.read_text(errors="replace")))

    print(
        f"frames sent {total.sent}, handled {total.handled} ({total.answered} answered, "
        f"{total.refused} refused by closing)"
    )
    print(f"broker deaths: {deaths} (same broker processes throughout: {survivors})")
    print(f"unhandled errors in the log: {unhandled}")
    print(
        f"bystander: {len(total.bystander_latencies)} requests, p99 "
        f"{total.bystander_p99_s * 1000:.1f} ms, max {total.bystander_max_s * 1000:.1f} ms, "
        f"failures {len(total.bystander_failures)}"
    )
    print("peak RSS per broker (MiB): " + ", ".join(f"{v:.0f}" for v in peaks.values()))
    print(f"untouched topic unchanged: {unchanged}")
    ok = deaths == 0 and survivors and unhandled == 0 and unchanged and not total.bystander_failures
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
