"""``[broker] event_loop``: which loop a broker process runs on, and the fix when the chosen
one is not installed."""

from __future__ import annotations

import asyncio
import sys

import pytest
import uvloop

from icefloe.broker.event_loop import event_loop_factory, running_loop_name
from icefloe.errors import ConfigError


@pytest.mark.parametrize("choice", ["auto", "uvloop"])
def test_uvloop_runs_where_it_is_installed(choice: str) -> None:
    loop = event_loop_factory(choice)()  # type: ignore[arg-type]
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(named()) == "uvloop"
    finally:
        loop.close()


def test_asyncio_is_the_standard_librarys_loop() -> None:
    loop = event_loop_factory("asyncio")()
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(named()) == "asyncio"
    finally:
        loop.close()


def test_auto_without_uvloop_runs_asyncio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # what `import uvloop` then raises
    assert event_loop_factory("auto") is asyncio.new_event_loop


def test_uvloop_chosen_but_not_installed_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    with pytest.raises(ConfigError, match=r"pip install uvloop.*event_loop = 'asyncio'"):
        event_loop_factory("uvloop")


async def named() -> str:
    return running_loop_name()
