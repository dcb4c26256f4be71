"""A long run of metadata-store faults under compaction, by hand (pytest does not collect it):

    python -m tests.chaos.leadership --store etcd --faults 12 --seed 7

`icefloe serve` (two brokers) on an etcd or Oxia server of its own, a steady produce load, and
``--faults`` faults in a random order: the server killed -9 and started again, or paused past
the compaction lease. Each run prints its figures and fails as the suite's short run
(tests/integration/test_compaction_leadership.py) does: a leader acting after the next was
elected, a conflict loop, a process dying, a table missing or doubling a record, or tables
that do not catch up within a minute of the last fault. Its folders are kept under --workdir.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from tests.support.leadership import outage_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=["etcd", "oxia"], action="append")
    parser.add_argument("--faults", type=int, default=10, help="faults per run")
    parser.add_argument("--runs", type=int, default=1, help="runs per store")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 16)
    chooser = random.Random(seed)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="icefloe-leadership-"))
    print(f"seed {seed}; folders under {workdir}")
    for run in range(args.runs):
        for store in args.store or ["etcd", "oxia"]:
            faults = [chooser.choice(["kill", "pause"]) for _ in range(args.faults)]
            started = time.monotonic()
            outcome = outage_run(store, workdir / f"{store}-{run}", faults)
            print(f"run {run}, {time.monotonic() - started:.0f} s: {outcome.figures()}")
            outcome.check()


if __name__ == "__main__":
    main()
