"""Documentation that cannot drift: every hook and every CLI command is documented."""

from __future__ import annotations

from pathlib import Path

from icefloe.cli import cli
from icefloe.plugins import hookspecs

ROOT = Path(__file__).resolve().parents[2]


def test_every_hook_is_documented_in_the_plugin_guide() -> None:
    guide = (ROOT / "docs" / "writing-plugins.md").read_text()
    hooks = [name for name in vars(hookspecs) if name.startswith("icefloe_")]
    assert hooks
    for hook in hooks:
        assert f"### `{hook}`" in guide, f"hook {hook} is missing from docs/writing-plugins.md"


def test_every_cli_command_is_in_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in cli.list_commands(None):  # type: ignore[arg-type]
        assert f"icefloe {name}" in readme, f"`icefloe {name}` is missing from README.md"
