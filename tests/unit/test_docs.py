"""Documentation that cannot drift: every hook and every CLI command is documented."""

from __future__ import annotations

import re
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


def test_every_test_the_design_cites_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    cited = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", design)
    assert len(cited) >= 9
    for path, name in cited:
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{path}::{name} is gone"
