"""Check Kafka client histories and print a report per file.

    python -m tests.history FILE [FILE ...] [--summary] [--no-ww-deps] [--examples N]

Prints one JSON object per file, a line each (`--summary`: a few readable lines instead).
Exit status 0 when every history is valid, 1 when one has an anomaly Kafka forbids, 2 when
one cannot be read or does not follow the format (the message names the line).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.history.checker import check
from tests.history.model import HistoryError, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.history",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE")
    parser.add_argument("--summary", action="store_true", help="readable lines instead of JSON")
    parser.add_argument(
        "--no-ww-deps",
        dest="ww_deps",
        action="store_false",
        help="infer no write-write dependencies: hunt for pure write-read cycles (G1c forbidden)",
    )
    parser.add_argument("--examples", type=int, default=8, help="examples per anomaly type")
    args = parser.parse_args(argv)
    unreadable = invalid = False
    for path in args.files:
        try:
            ops = load(path)
        except (HistoryError, OSError) as error:
            print(f"{path}: cannot check: {error}", file=sys.stderr)
            unreadable = True
            continue
        report = check(ops, ww_deps=args.ww_deps, max_examples=max(args.examples, 1))
        invalid = invalid or not report.valid
        if args.summary:
            print(f"{path}: {report.summary()}")
        else:
            print(json.dumps({"file": str(path), **report.to_dict()}, separators=(",", ":")))
    return 2 if unreadable else 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
