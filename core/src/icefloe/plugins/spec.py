"""How a plugin describes a backend without importing it."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from icefloe.errors import PluginError
from icefloe.ports.base import Port, PortKind


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A backend a plugin provides, described lazily.

    Attributes:
        kind: The port the backend implements.
        name: Its name in configuration, e.g. ``"etcd"``.
        target: The adapter class as ``"package.module:Class"``; imported only when opened.
        description: One line for ``icefloe plugins``.
    """

    kind: PortKind
    name: str
    target: str
    description: str

    def __post_init__(self) -> None:
        module, _, attr = self.target.partition(":")
        if not module or not attr:
            raise PluginError(
                f"backend {self.kind}/{self.name}: target {self.target!r} "
                "must be 'package.module:Class'"
            )

    def load(self) -> type[Port]:
        """Import the adapter class and check that it implements the right port."""
        module_name, _, attr = self.target.partition(":")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except ImportError as exc:
            raise PluginError(
                f"backend {self.kind}/{self.name} cannot be imported from {self.target!r}: {exc}"
            ) from exc
        except AttributeError as exc:
            raise PluginError(
                f"backend {self.kind}/{self.name}: {self.target!r} not found"
            ) from exc
        if not (isinstance(obj, type) and issubclass(obj, Port) and obj.kind == self.kind):
            raise PluginError(
                f"backend {self.kind}/{self.name}: {self.target!r} is not a {self.kind} adapter"
            )
        return obj
