"""Importing Icefloe does not make kio import hypothesis, and leaves hypothesis importable.

Each case runs in a fresh interpreter: the test process has imported both already.
"""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_importing_icefloe_leaves_hypothesis_unimported_and_importable_after() -> None:
    out = _run(
        "import sys, icefloe, icefloe.errors\n"
        "import kio.static._phantom as phantom\n"
        "print('hypothesis' in sys.modules, phantom.hypothesis is None)\n"
        "import hypothesis.strategies\n"
        "print(callable(hypothesis.strategies.integers))\n"
    )
    assert out.splitlines() == ["False True", "True"]


def test_the_brokers_module_imports_kio_without_hypothesis() -> None:
    # What a spawned broker imports first.
    out = _run("import sys, icefloe.broker.serve\nprint('hypothesis' in sys.modules)\n")
    assert out == "False"


def test_kio_keeps_hypothesis_when_it_was_imported_first() -> None:
    out = _run(
        "import hypothesis, icefloe\n"
        "import kio.static._phantom as phantom\n"
        "print(phantom.hypothesis is not None)\n"
    )
    assert out == "True"
