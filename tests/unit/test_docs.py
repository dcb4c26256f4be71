"""Documentation that cannot drift: every hook and every CLI command is documented, and every
TOML and Python snippet in README.md, docs/ and the plugins' READMEs works.

A TOML snippet must be a valid configuration. A Python snippet must compile, and runs (in an
empty folder, on the embedded defaults) unless the line before it is an HTML comment starting
``<!-- docs-test: compile only``, which says what else it needs.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from icefloe import config as configuration
from icefloe.cli import cli
from icefloe.plugins import hookspecs
from icefloe.ports import PORTS

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


SNIPPET_FILES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "plugins").glob("*/README.md")]
)
COMPILE_ONLY = "<!-- docs-test: compile only"
"""Put before a ```python block that needs more than itself (a running `icefloe serve`, a
topic already in the tables): the test then only compiles it, and the comment says why."""


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int
    language: str
    text: str
    compile_only: bool

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def snippets(language: str) -> list[Snippet]:
    """Every fenced block of ``language`` in README.md, docs/ and the plugins' READMEs."""
    found = []
    for path in SNIPPET_FILES:
        text = path.read_text()
        for match in re.finditer(rf"^```{language}\n(.*?)^```$", text, re.M | re.S):
            before = text[: match.start()].rstrip().rsplit("\n", 1)[-1]
            line = text.count("\n", 0, match.start()) + 1
            compile_only = before.startswith(COMPILE_ONLY)
            found.append(Snippet(path, line, language, match.group(1), compile_only))
    return found


def test_the_docs_have_snippets_of_both_languages() -> None:
    assert len(snippets("toml")) >= 10
    assert len(snippets("python")) >= 3


@pytest.mark.parametrize("snippet", snippets("toml"), ids=lambda s: s.name)
def test_a_toml_snippet_is_a_valid_configuration(snippet: Snippet, tmp_path: Path) -> None:
    """Loaded as `icefloe --config` loads a file, then every port resolved as `config check`
    does: a snippet that shows part of a file must be valid on its own too."""
    path = tmp_path / "icefloe.toml"
    path.write_text(snippet.text)
    config = configuration.load_config(path, env={})
    for port in PORTS.values():
        configuration.resolve(config, port)


@pytest.mark.parametrize("snippet", snippets("python"), ids=lambda s: s.name)
def test_a_python_snippet_runs(snippet: Snippet, tmp_path: Path) -> None:
    """Runs on the embedded defaults in an empty folder, unless marked compile-only."""
    ast.parse(snippet.text, filename=snippet.name)
    if snippet.compile_only:
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEFLOE_")}
    result = subprocess.run(
        [sys.executable, "-c", snippet.text],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
