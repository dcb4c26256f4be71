"""Peak broker memory under overload: producers at full speed plus connections that pipeline
produce and fetch requests and never read an answer.

    .venv/bin/python -m tests.bench.overload_bench --seconds 30 --budget-mib 256

Prints the broker's RSS at rest (after a warm-up), its peak under overload (VmHWM), the
difference, and the configured ``broker.max_memory_bytes``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from tests.support.broker import broker_pids, start_icefloe
from tests.support.overload import Overload, memory_mib
from tests.support.topics import create_topic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--pipeliners", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="icefloe-overload-") as folder:
        running = start_icefloe(
            Path(folder) / "data",
            env={"ICEFLOE_BROKER__MAX_MEMORY_BYTES": str(args.budget_mib << 20)},
            yielding=True,
        )
        try:
            create_topic(running, "flood", 8)
            (pid,) = broker_pids(running)
            Overload(running.bootstrap, "flood", 8, producers=1, pipeliners=0).run(2)
            time.sleep(1)
            rest, _ = memory_mib(pid)
            acked = Overload(running.bootstrap, "flood", 8, args.producers, args.pipeliners).run(
                args.seconds
            )
            now, peak = memory_mib(pid)
        finally:
            running.stop()
    print(
        f"RSS at rest {rest:.0f} MiB, peak under overload {peak:.0f} MiB "
        f"(+{peak - rest:.0f} MiB), at the end {now:.0f} MiB; "
        f"budget {args.budget_mib} MiB; {acked} records acknowledged"
    )


if __name__ == "__main__":
    main()
