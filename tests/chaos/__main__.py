"""Brokers of a 3-broker ``icefloe serve`` SIGKILLed every 10-15 s (and once every process of
the cluster at once) while idempotent producers write and a consumer group reads; then every
acknowledged record is looked for in the stream and in both tables.

    python -m tests.chaos --minutes 30 [--rounds N] [--seed S] [--keep DIR]
    python -m tests.chaos --store etcd --store-faults [--no-broker-kills] ...

With ``--store etcd`` or ``oxia`` the metadata is on such a server, started for each round;
``--store-faults`` kills it (SIGKILL, restarted 3 s later) and pauses it (SIGSTOP for 15 s)
in turn every 20-30 s.

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
    parser.add_argument("--store", choices=["sqlite", "etcd", "oxia"], default="sqlite")
    parser.add_argument("--store-faults", action="store_true")
    parser.add_argument("--no-broker-kills", dest="broker_kills", action="store_false")
    args = parser.parse_args()
    failed = 0
    for n in range(args.rounds):
        folder = args.keep or Path(tempfile.mkdtemp(prefix="icefloe-chaos-"))
        result = broker_kill_round(
            folder / f"round-{n}",
            seconds=args.minutes * 60 / args.rounds,
            seed=args.seed + n,
            kill_brokers=args.broker_kills,
            kill_everything_once=args.broker_kills,
            store=args.store,
            store_faults=args.store_faults,
        )
        print(result.summary(), flush=True)
        failed += bool(result.problems) or not result.kills
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
