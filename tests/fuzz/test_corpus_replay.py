"""Every input kept in ``tests/fuzz/corpus/`` replayed through its target: the seeds, what fuzz
runs found reaching new code, and the inputs of the defects fuzzing found (``regression-*``).
An input that a target no longer takes or refuses the documented way fails here, long before
anyone runs the fuzzer again (``python -m tests.fuzz TARGET``)."""

from __future__ import annotations

import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fuzz import seeds, targets

MAX_FILES = 200
MAX_BYTES = 2 << 20
KNOWN = Path(__file__).parent / "known"
"""Inputs of defects not fixed yet, which a replay in this process would not survive."""


@pytest.fixture(scope="module", autouse=True)
def _close_targets() -> Iterator[None]:
    yield
    targets.close()


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_every_corpus_input_is_taken_or_refused_as_documented(name: str) -> None:
    files = sorted(targets.corpus_folder(name).iterdir())
    assert files, f"the corpus of {name} is empty"
    failures = []
    for path in files:
        try:
            targets.TARGETS[name].run(path.read_bytes())
        except Exception:  # noqa: BLE001 - every failure is reported, not only the first
            failures.append(f"{path.name}:\n{traceback.format_exc()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_each_corpus_holds_its_seeds_as_the_writers_build_them_today(name: str) -> None:
    """A writer whose output changed leaves seeds that no longer start inside the format."""
    folder = targets.corpus_folder(name)
    for label, data in seeds.BUILDERS[name]().items():
        path = folder / f"seed-{label}"
        assert path.exists(), f"{path} is missing: python -m tests.fuzz {name} writes it"
        assert path.read_bytes() == data, f"{path} is stale: delete it and run the fuzzer"


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_each_corpus_stays_small(name: str) -> None:
    files = list(targets.corpus_folder(name).iterdir())
    size = sum(path.stat().st_size for path in files)
    assert len(files) <= MAX_FILES, f"{len(files)} files: python -m tests.fuzz {name} --minimize"
    assert size <= MAX_BYTES, f"{size} bytes: python -m tests.fuzz {name} --minimize"


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="pyarrow 26 ends the process (std::terminate) on a data file whose column chunk "
    "holds size statistics that do not fit its column: RowGroupMetaData.column does not turn "
    "the C++ exception into a Python one",
)
def test_a_data_file_with_size_statistics_that_do_not_fit_is_refused_not_fatal() -> None:
    """Replayed in a process of its own, which the defect ends."""
    replay = (
        "import sys\n"
        "from tests.fuzz import targets\n"
        "targets.parquet_rebuild(open(sys.argv[1], 'rb').read())\n"
        "targets.close()\n"
    )
    found = KNOWN / "parquet_rebuild-size-statistics-do-not-fit"
    done = subprocess.run(
        [sys.executable, "-c", replay, str(found)],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        timeout=120,
        check=False,
    )
    said = done.stderr.decode(errors="replace")[-2000:]
    if done.returncode not in (0, -signal.SIGABRT):
        raise RuntimeError(f"the replay failed otherwise than by the known abort: {said}")
    assert done.returncode == 0, said
