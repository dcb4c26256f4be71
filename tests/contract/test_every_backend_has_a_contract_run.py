"""Opting in is not optional: every installed backend has a contract run in this folder."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

from icefloe.plugins import BackendRegistry
from icefloe.testing.contract import Contract

HERE = Path(__file__).parent


def contract_runs() -> set[tuple[str, str]]:
    """(port, backend) of every Contract subclass defined in tests/contract/test_*.py."""
    runs = set()
    for path in sorted(HERE.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        spec = importlib.util.spec_from_file_location(f"_contract_scan_{path.stem}", path)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Contract) and cls.__name__.startswith("Test"):
                runs.add((cls.port_kind.value, cls.backend_name))
    return runs


def test_every_installed_backend_runs_its_port_contract() -> None:
    installed = {(b.kind.value, b.name) for b in BackendRegistry().installed()}
    missing = sorted(installed - contract_runs())
    assert not missing, (
        f"installed backends without a contract run in tests/contract/: {missing}; "
        "add a test_<port>_<backend>.py opting in to the port's contract suite"
    )
