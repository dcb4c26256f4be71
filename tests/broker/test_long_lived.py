"""A broker keeps modules imported after start out of the garbage collector's full passes."""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from icefloe.broker.long_lived import freeze_long_lived, freeze_new_imports
from tests.support.waiting import eventually

SETTLE_S = 0.02


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """Freezing is process-wide: the test process gets its collector back as it was."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def is_walked_by_full_passes(thing: object) -> bool:
    return any(o is thing for o in gc.get_objects())


async def test_a_module_imported_after_start_is_frozen_once_imports_settle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "late_plugin.py").write_text("class Schema:\n    fields = ['a', 'b']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    freezer = asyncio.create_task(freeze_new_imports(SETTLE_S))
    try:
        await asyncio.sleep(SETTLE_S * 3)
        module = importlib.import_module("late_plugin")
        assert is_walked_by_full_passes(module.Schema.fields)

        await eventually(lambda: gc.get_freeze_count() > 0)

        assert not is_walked_by_full_passes(module.Schema.fields)
    finally:
        freezer.cancel()
        sys.modules.pop("late_plugin", None)


async def test_without_new_imports_nothing_is_frozen() -> None:
    freezer = asyncio.create_task(freeze_new_imports(SETTLE_S))
    try:
        await asyncio.sleep(SETTLE_S * 10)
    finally:
        freezer.cancel()

    assert gc.get_freeze_count() == 0


def test_garbage_present_at_a_freeze_is_collected_rather_than_frozen() -> None:
    class Node:
        pass

    cycle = Node()
    cycle.self = cycle  # type: ignore[attr-defined]
    dead = weakref.ref(cycle)
    del cycle

    freeze_long_lived()

    assert dead() is None
    assert gc.get_freeze_count() > 0
