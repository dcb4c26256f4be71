"""kio, imported so that it does not import hypothesis.

When hypothesis is installed (the ``testing`` extra, any development environment), kio imports
it and registers a hypothesis strategy for each of its protocol types as they are defined.
That costs about half a second of the start of every process: the ``icefloe`` command, each
broker, the compactor. Icefloe never generates kio values, so importing ``icefloe`` imports
kio with hypothesis hidden. Only kio's import is affected: a later ``import hypothesis``
(``icefloe contract-test`` runs the contract suites, which use it) finds it as usual. Where
hypothesis is imported first (pytest loads it as a plugin), kio gets it as before.
"""

from __future__ import annotations

import sys
from typing import Final

_KIO_TYPES: Final = "kio.static._phantom"
"""The kio module that imports hypothesis, once, for every kio type defined after it."""


def import_kio_without_hypothesis() -> None:
    """Import kio's base of protocol types with hypothesis hidden from it. Does nothing once
    either is imported: kio would keep its hypothesis strategies, or hypothesis is in use."""
    if _KIO_TYPES in sys.modules or "hypothesis" in sys.modules:
        return
    # None in sys.modules makes an import raise ImportError, which kio takes as "not
    # installed"; kio looks once, as that module is imported.
    sys.modules["hypothesis"] = None  # type: ignore[assignment]
    try:
        import kio.static._phantom  # noqa: F401 - imported for its effect on kio's types
    finally:
        del sys.modules["hypothesis"]
