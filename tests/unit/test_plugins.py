"""Plugin discovery: entry points, lazy backend descriptions, conflicts and errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pluggy
import pytest

from icefloe.embedded import plugin as embedded_plugin
from icefloe.errors import BackendNotInstalledError, ConfigError, DuplicateBackendError, PluginError
from icefloe.plugins import (
    KNOWN_BACKENDS,
    PROJECT,
    BackendRegistry,
    get_plugin_manager,
    hookimpl,
    hookspecs,
)
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import PortKind


class Provides:
    """An in-test plugin announcing the given specs."""

    def __init__(self, *specs: BackendSpec) -> None:
        self.specs = list(specs)

    @hookimpl
    def icefloe_register_backends(self) -> list[BackendSpec]:
        return self.specs


def registry_with(*plugins: object) -> BackendRegistry:
    return BackendRegistry(get_plugin_manager(extra_plugins=plugins))


def test_embedded_backends_are_found_through_the_entry_point() -> None:
    found = {(b.kind, b.name): b for b in BackendRegistry().installed()}
    for key in [
        (PortKind.METADATA, "sqlite"),
        (PortKind.OBJECT_STORE, "local"),
        (PortKind.WAL, "object"),
    ]:
        assert found[key].distribution == "icefloe"


def test_listing_backends_imports_no_adapter_module() -> None:
    spec = BackendSpec(PortKind.METADATA, "lazy", "some_sdk_adapter_module:Store", "lazy")
    registry = registry_with(Provides(spec))
    assert registry.get(PortKind.METADATA, "lazy").spec is spec
    assert "some_sdk_adapter_module" not in sys.modules


def test_two_plugins_claiming_one_backend_name_is_an_error_naming_both() -> None:
    first = Provides(BackendSpec(PortKind.METADATA, "sqlite", "a.b:C", "duplicate"))
    with pytest.raises(DuplicateBackendError) as exc:
        registry_with(first)
    message = str(exc.value)
    assert "icefloe" in message  # the embedded distribution
    assert "Provides" in message  # the in-test plugin (no distribution: its class name)


def test_unknown_backend_name_lists_valid_choices() -> None:
    with pytest.raises(ConfigError, match=r"valid choices: azure, gcs, local, s3$"):
        BackendRegistry().get(PortKind.OBJECT_STORE, "ftp")


def test_known_backend_not_installed_names_both_ways_to_install_it() -> None:
    bare = pluggy.PluginManager(PROJECT)  # only the embedded defaults, no plugin distribution
    bare.add_hookspecs(hookspecs)
    bare.register(embedded_plugin)
    with pytest.raises(BackendNotInstalledError) as caught:
        BackendRegistry(bare).get(PortKind.OBJECT_STORE, "s3")
    assert str(caught.value) == (
        "the object_store backend 's3' is not installed: run `pip install icefloe-store-s3` "
        "(from a source checkout of Icefloe: `pip install ./plugins/store_s3`)"
    )


def test_every_known_distribution_has_its_folder_in_the_repository() -> None:
    root = Path(__file__).resolve().parents[2]
    for backends in KNOWN_BACKENDS.values():
        for distribution in backends.values():
            if distribution == "icefloe":
                continue
            folder = distribution.removeprefix("icefloe-").replace("-", "_")
            assert (root / "plugins" / folder / "pyproject.toml").is_file(), distribution


def test_the_bookkeeper_wal_not_installed_names_both_ways_to_install_it() -> None:
    bare = pluggy.PluginManager(PROJECT)
    bare.add_hookspecs(hookspecs)
    bare.register(embedded_plugin)
    with pytest.raises(BackendNotInstalledError) as caught:
        BackendRegistry(bare).get(PortKind.WAL, "bookkeeper")
    assert str(caught.value) == (
        "the wal backend 'bookkeeper' is not installed: run `pip install icefloe-wal-bookkeeper` "
        "(from a source checkout of Icefloe: `pip install ./plugins/wal_bookkeeper`)"
    )


def test_target_must_name_module_and_class() -> None:
    with pytest.raises(PluginError, match=r"package\.module:Class"):
        BackendSpec(PortKind.WAL, "x", "no_colon_here", "bad")


def test_loading_a_missing_module_is_a_plugin_error() -> None:
    spec = BackendSpec(PortKind.WAL, "x", "icefloe_no_such_module:X", "missing")
    with pytest.raises(PluginError, match="cannot be imported"):
        spec.load()


def test_loading_a_class_of_another_port_is_a_plugin_error() -> None:
    spec = BackendSpec(
        PortKind.WAL, "x", "icefloe.embedded.sqlite_metadata:SqliteMetadataStore", "wrong"
    )
    with pytest.raises(PluginError, match="is not a wal adapter"):
        spec.load()


def test_third_party_names_become_valid_choices() -> None:
    registry = registry_with(Provides(BackendSpec(PortKind.METADATA, "zk", "a.b:C", "zk")))
    assert "zk" in registry.names(PortKind.METADATA)
    assert "sqlite" in registry.names(PortKind.METADATA)
