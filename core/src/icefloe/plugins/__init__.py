"""Plugin discovery: entry points, the plugin manager and the backend registry.

Plugins register under the entry-point group :data:`ENTRY_POINT_GROUP`; the embedded backends in
core are registered the same way (``icefloe = icefloe.embedded.plugin``), so built-in and
third-party backends take one path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Final, cast

import pluggy

from icefloe.errors import (
    BackendNotInstalledError,
    ConfigError,
    DuplicateBackendError,
    PluginError,
)
from icefloe.plugins import hookspecs
from icefloe.plugins.spec import BackendSpec
from icefloe.ports.base import Port, PortKind

PROJECT: Final = "icefloe"
ENTRY_POINT_GROUP: Final = "icefloe.plugins"

hookimpl = pluggy.HookimplMarker(PROJECT)

KNOWN_BACKENDS: Final[dict[PortKind, dict[str, str]]] = {
    PortKind.METADATA: {
        "sqlite": "icefloe",
        "oxia": "icefloe-metadata-oxia",
        "etcd": "icefloe-metadata-etcd",
    },
    PortKind.OBJECT_STORE: {
        "local": "icefloe",
        "s3": "icefloe-store-s3",
        "gcs": "icefloe-store-gcs",
        "azure": "icefloe-store-azure",
    },
    PortKind.WAL: {"object": "icefloe", "bookkeeper": "icefloe-wal-bookkeeper"},
    PortKind.TABLE: {"iceberg": "icefloe-table-iceberg", "delta": "icefloe-table-delta"},
    PortKind.COMPACTION: {"local": "icefloe", "spark": "icefloe-compaction-spark"},
}
"""Backend names used across the project, with the distribution that provides each."""


def install_hint(distribution: str) -> str:
    """How to install a plugin distribution, from an index or from a source checkout."""
    folder = distribution.removeprefix("icefloe-").replace("-", "_")
    return (
        f"`pip install {distribution}` (from a source checkout of Icefloe: "
        f"`pip install ./plugins/{folder}`)"
    )


def get_plugin_manager(*, extra_plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """A new plugin manager with every installed plugin loaded.

    Args:
        extra_plugins: Plugin objects (modules or instances) to register in addition to the
            entry points, e.g. from a test.
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        dist = entry_point.dist
        label = f"{dist.name} {dist.version}" if dist else entry_point.value
        try:
            plugin = entry_point.load()
        except Exception as exc:
            raise PluginError(
                f"the plugin {entry_point.name!r} of {label} cannot be loaded ({exc}); "
                "reinstall or uninstall it"
            ) from exc
        if pm.is_registered(plugin):
            continue
        name = f"{_DIST_MARK}{dist.name}{_DIST_MARK}{dist.version}" if dist else entry_point.name
        pm.register(plugin, name=f"{name}{_DIST_MARK}{entry_point.name}")
    for plugin in extra_plugins:
        pm.register(plugin)
    return pm


_DIST_MARK: Final = "|"
"""Separates distribution, version and entry-point name in a plugin's registered name."""


def _distribution_of(pm: pluggy.PluginManager, plugin: object) -> tuple[str, str]:
    """(distribution, version) of a plugin loaded from an entry point, else a label."""
    name = pm.get_name(plugin) or ""
    if name.startswith(_DIST_MARK):
        dist_name, dist_version, _ = name[1:].split(_DIST_MARK, 2)
        return dist_name, dist_version
    return _plugin_label(plugin), "-"


@dataclass(frozen=True, slots=True)
class InstalledBackend:
    """A backend found in an installed plugin."""

    spec: BackendSpec
    distribution: str
    version: str

    @property
    def kind(self) -> PortKind:
        return self.spec.kind

    @property
    def name(self) -> str:
        return self.spec.name

    def load(self) -> type[Port]:
        return self.spec.load()


class BackendRegistry:
    """The installed backends by port and name."""

    def __init__(self, pm: pluggy.PluginManager | None = None) -> None:
        self._pm = pm or get_plugin_manager()
        self._backends: dict[tuple[PortKind, str], InstalledBackend] = {}
        for impl in self._pm.hook.icefloe_register_backends.get_hookimpls():
            dist_name, dist_version = _distribution_of(self._pm, impl.plugin)
            specs = cast("list[BackendSpec] | None", impl.function())
            for spec in specs or ():
                self._add(InstalledBackend(spec, dist_name, dist_version))

    def _add(self, backend: InstalledBackend) -> None:
        key = (backend.kind, backend.name)
        other = self._backends.get(key)
        if other is not None:
            raise DuplicateBackendError(
                f"two plugins provide the {backend.kind} backend {backend.name!r}: "
                f"{other.distribution} ({other.spec.target}) and "
                f"{backend.distribution} ({backend.spec.target}); uninstall one of them"
            )
        self._backends[key] = backend

    def installed(self, kind: PortKind | None = None) -> list[InstalledBackend]:
        """Installed backends, sorted by port then name."""
        found = [b for b in self._backends.values() if kind is None or b.kind == kind]
        return sorted(found, key=lambda b: (list(PortKind).index(b.kind), b.name))

    def names(self, kind: PortKind) -> list[str]:
        """Every valid backend name for ``kind``: known to the project or installed."""
        return sorted(set(KNOWN_BACKENDS[kind]) | {b.name for b in self.installed(kind)})

    def get(self, kind: PortKind, name: str) -> InstalledBackend:
        """The installed backend ``name`` for ``kind``.

        Raises:
            BackendNotInstalledError: a known backend whose distribution is not installed (the
                message gives the ``pip install`` to run).
            ConfigError: an unknown name; the message lists the valid choices.
        """
        backend = self._backends.get((kind, name))
        if backend is not None:
            return backend
        distribution = KNOWN_BACKENDS[kind].get(name)
        if distribution is not None:
            raise BackendNotInstalledError(
                f"the {kind} backend {name!r} is not installed: run {install_hint(distribution)}"
            )
        raise ConfigError(
            f"[{kind}] backend = {name!r} is not a {kind} backend; "
            f"valid choices: {', '.join(self.names(kind))}"
        )


def _plugin_label(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return type(plugin).__qualname__
