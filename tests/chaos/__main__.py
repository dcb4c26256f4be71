"""Brokers of a 3-broker ``icefloe serve`` SIGKILLed every 10-15 s while idempotent producers
write and a consumer group reads; then every acknowledged record is looked for in the stream
and in both tables.

    python -m tests.chaos --minutes 30 [--rounds N] [--seed S] [--keep DIR]

Each round runs a fresh cluster for ``--minutes`` / ``--rounds``. Exit status 1 if any round
found a record lost, duplicated, misplaced or out of order.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tests.chaos.runs import broker_kill_round


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="keep each round's data and logs here")
    args = parser.parse_args()
    failed = 0
    for n in range(args.rounds):
        folder = args.keep or Path(tempfile.mkdtemp(prefix="icefloe-chaos-"))
        result = broker_kill_round(
            folder / f"round-{n}", seconds=args.minutes * 60 / args.rounds, seed=args.seed + n
        )
        print(result.summary(), flush=True)
        failed += bool(result.problems) or not result.kills
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
