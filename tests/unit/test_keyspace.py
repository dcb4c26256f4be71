"""The metadata keyspace is declared once: every prefix in icefloe.keyspace, each used only by
the modules the declaration names, no prefix spelled out anywhere else, and docs/design.md
showing every key family with its owner."""

from __future__ import annotations

import ast
from pathlib import Path

from icefloe import keyspace

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "core" / "src"
CONSTANTS = {p.name for p in keyspace.KEYSPACE}


def modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted((CORE / "icefloe").rglob("*.py")):
        name = ".".join(path.relative_to(CORE).with_suffix("").parts).removesuffix(".__init__")
        found[name] = ast.parse(path.read_text())
    return found


def prefix_users(tree: ast.Module) -> set[str]:
    """The keyspace constants a module imports or reads as ``keyspace.NAME``."""
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "icefloe.keyspace":
            used |= {alias.name for alias in node.names if alias.name in CONSTANTS}
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "keyspace"
            and node.attr in CONSTANTS
        ):
            used.add(node.attr)
    return used


def test_every_prefix_constant_is_declared_with_an_owner() -> None:
    defined = {
        name
        for name, value in vars(keyspace).items()
        if name.isupper() and isinstance(value, str) and value.endswith("/")
    }
    assert defined == CONSTANTS
    for family in keyspace.KEYSPACE:
        assert family.layout.startswith(family.prefix), family
        assert getattr(keyspace, family.name) == family.prefix


def test_no_prefix_is_inside_another() -> None:
    prefixes = sorted({p.prefix for p in keyspace.KEYSPACE})
    for a in prefixes:
        for b in prefixes:
            assert a == b or not b.startswith(a), f"{b!r} lies under {a!r}"


def test_only_declared_owners_and_readers_use_a_prefix() -> None:
    allowed: dict[str, set[str]] = {}
    for family in keyspace.KEYSPACE:
        allowed.setdefault(family.name, set()).update({family.owner, *family.readers})
    for module, tree in modules().items():
        for name in prefix_users(tree):
            assert module in allowed[name], f"{module} uses keyspace.{name} but is not declared"


def test_no_module_spells_out_a_prefix() -> None:
    prefixes = {p.prefix for p in keyspace.KEYSPACE}
    for module, tree in modules().items():
        if module == "icefloe.keyspace" or module.startswith("icefloe.testing"):
            continue  # the contract suites exercise a store with keys of their own
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not any(node.value.startswith(p) for p in prefixes), (
                    f"{module} spells out a key prefix: {node.value!r}; use icefloe.keyspace"
                )


def test_the_design_shows_every_key_family_and_its_owner() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    for family in keyspace.KEYSPACE:
        assert f"`{family.layout}`" in design, family.layout
        assert f"`{family.owner}`" in design, family.owner
