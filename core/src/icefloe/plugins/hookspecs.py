"""Hook specifications: the contract between Icefloe and its plugins.

A plugin is a module registered under the entry-point group ``icefloe.plugins`` that implements
some of these hooks with ``@icefloe.plugins.hookimpl``. Hook implementations must not import
backend SDKs: they return descriptions, and the SDK is imported only when a backend is opened.
"""

from __future__ import annotations

import pluggy

from icefloe.plugins.spec import BackendSpec

hookspec = pluggy.HookspecMarker("icefloe")


@hookspec
def icefloe_register_backends() -> list[BackendSpec]:  # type: ignore[empty-body]
    """Announce the backends this plugin provides.

    Called once when the plugin manager is built. Each plugin returns a list; Icefloe collects
    the lists of all plugins.

    Returns:
        One :class:`~icefloe.plugins.spec.BackendSpec` per backend: the port it implements,
        its name in configuration (``[metadata] backend = "<name>"``), the adapter class as a
        ``"package.module:Class"`` string, and a one-line description. Two plugins returning
        the same (port, name) is an error naming both distributions.
    """
