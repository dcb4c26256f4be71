"""``python -m tests.bench.sidebyside``: see the package's docstring, or ``--help``."""

from __future__ import annotations

import sys

from tests.bench.sidebyside.cli import main

if __name__ == "__main__":
    sys.exit(main())
