"""Run atheris (libFuzzer) on one fuzz target, by hand; the corpus grows with what it finds.

    .venv/bin/python -m tests.fuzz TARGET [--seconds N] [--jobs J]
    .venv/bin/python -m tests.fuzz TARGET --minimize

TARGET is one of :data:`tests.fuzz.targets.TARGETS` (``request_frame``, ``record_batches``,
``wal_object``, ``parquet_rebuild``, ``sasl_exchange``, ``registry_body``). The target's seeds
(``seeds.py``) are written to ``tests/fuzz/corpus/TARGET/`` if missing, then J fuzzing processes
run for N seconds on that corpus, each adding the inputs that reach new code to it. An input
that fails (an exception other than the target's refusals, a timeout, memory past the limit)
is written to ``--findings`` (``fuzz-findings/`` by default) and ends that process with a
non-zero status; the run's status is the worst of its processes'. ``--minimize`` keeps, of the
inputs fuzzing added, only those libFuzzer's ``-merge=1`` needs to keep the corpus's coverage
(seeds and ``regression-*`` inputs always stay).

Each process keeps its stores (a metadata store, an object store) in a temporary folder that
this command removes when the process ends: libFuzzer leaves without Python's clean-up.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

SCRATCH_ENV = "ICEFLOE_FUZZ_SCRATCH"  # tests.fuzz.targets.SCRATCH_ENV, without importing it
KEPT_PREFIXES = ("seed-", "regression-")
_PACKAGES = {
    "request_frame": ["icefloe"],
    "record_batches": ["icefloe"],
    "wal_object": ["icefloe"],
    "parquet_rebuild": ["icefloe"],
    "sasl_exchange": ["icefloe", "scramp", "jwt"],
    "registry_body": ["icefloe", "avro", "jsonschema", "google.protobuf"],
}
"""The packages each target's parsers live in, instrumented for coverage (atheris instruments
whole top-level packages)."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.fuzz", description=__doc__.split("\n")[0]
    )
    parser.add_argument("target")
    parser.add_argument("--seconds", type=int, default=60, help="how long each process fuzzes")
    parser.add_argument("--jobs", type=int, default=1, help="fuzzing processes at once")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take")
    parser.add_argument("--rss-limit-mb", type=int, default=2048, help="memory of a process")
    parser.add_argument("--findings", type=Path, default=Path("fuzz-findings"))
    parser.add_argument("--minimize", action="store_true", help="shrink the corpus, no fuzzing")
    parser.add_argument("--merge-into", type=Path, help=argparse.SUPPRESS)
    args, libfuzzer_args = parser.parse_known_args(argv)
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("atheris is not installed: run `uv sync` (or `pip install atheris`)", file=sys.stderr)
        return 2
    if os.environ.get(SCRATCH_ENV):
        return _fuzz(args, libfuzzer_args)
    from tests.fuzz import seeds, targets

    if args.target not in targets.TARGETS or args.target not in _PACKAGES:
        parser.error(f"unknown target {args.target!r}; one of {', '.join(targets.TARGETS)}")
    written = seeds.write_missing(args.target)
    if written:
        print(f"wrote {written} seed(s) to {targets.corpus_folder(args.target)}")
    if args.minimize:
        return _minimize(args)
    args.findings.mkdir(parents=True, exist_ok=True)
    return _run_jobs(args, argv)


def _run_jobs(args: argparse.Namespace, argv: list[str]) -> int:
    """Start the fuzzing processes, each with a scratch folder removed when it ends."""
    with tempfile.TemporaryDirectory(prefix="icefloe-fuzz-") as scratch:
        processes = []
        for job in range(max(1, args.jobs)):
            folder = Path(scratch) / f"job-{job}"
            folder.mkdir()
            env = {**os.environ, SCRATCH_ENV: str(folder)}
            command = [sys.executable, "-m", "tests.fuzz", *argv]
            processes.append(subprocess.Popen(command, env=env))
        try:
            codes = [process.wait() for process in processes]
        except KeyboardInterrupt:
            for process in processes:
                process.terminate()
            codes = [process.wait() for process in processes]
    return max(codes, key=abs)


def _fuzz(args: argparse.Namespace, libfuzzer_args: list[str]) -> int:
    """In a fuzzing process: instrument the target's code, then hand over to libFuzzer."""
    import atheris

    # Per-input warnings (a header key that is not UTF-8, ...) would cost more than the input.
    logging.disable(logging.WARNING)
    with atheris.instrument_imports(include=["tests.fuzz.targets", *_PACKAGES[args.target]]):
        from tests.fuzz import targets

        target = targets.TARGETS[args.target]
        corpus = targets.corpus_folder(args.target)
        # Run the seeds once here, so that every module they reach is imported (and
        # instrumented) now: the targets import what they use as they first use it.
        for seed in sorted(corpus.glob("seed-*")):
            target.run(seed.read_bytes())

    def test_one_input(data: bytes) -> None:
        target.run(data)

    limits = [f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_limit_mb}"]
    if any(arg.startswith("-merge_inner") for arg in libfuzzer_args):
        run = []  # the step of a merge that libFuzzer started: it gave every argument
    elif args.merge_into is not None:
        run = ["-merge=1", *limits, str(args.merge_into), str(corpus)]
    else:
        run = [
            f"-max_total_time={args.seconds}",
            *limits,
            f"-artifact_prefix={args.findings}/{args.target}-",
            "-print_final_stats=1",
            str(corpus),
        ]
    # libFuzzer runs a merge's steps as processes of their own, started by a shell with this
    # command line's first word: the way this process was started, not the path of a module.
    again = f"{shlex.quote(sys.executable)} -m tests.fuzz {shlex.quote(args.target)}"
    atheris.Setup([again, *libfuzzer_args, *run], test_one_input)
    atheris.Fuzz()
    return 0


def _minimize(args: argparse.Namespace) -> int:
    """Drop the fuzz-found inputs that libFuzzer's merge does not need for coverage."""
    from tests.fuzz import targets

    corpus = targets.corpus_folder(args.target)
    with tempfile.TemporaryDirectory(prefix="icefloe-fuzz-merge-") as scratch:
        merged = Path(scratch) / "merged"
        merged.mkdir()
        command = [sys.executable, "-m", "tests.fuzz", args.target, "--merge-into", str(merged)]
        env = {**os.environ, SCRATCH_ENV: str(Path(scratch) / "stores")}
        code = subprocess.call(command, env=env)
        needed = {path.name for path in merged.iterdir()}
        if code or not needed:
            print(f"{args.target}: the merge failed; the corpus is left as it was")
            return code or 1
    removed = 0
    for path in sorted(corpus.iterdir()):
        if path.name.startswith(KEPT_PREFIXES):
            continue
        if hashlib.sha1(path.read_bytes()).hexdigest() not in needed:
            path.unlink()
            removed += 1
    print(f"{args.target}: removed {removed} input(s); {len(list(corpus.iterdir()))} left")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
