"""Configuration: one TOML file plus ``ICEFLOE_*`` environment overrides, validated into
:class:`Config`, and the backend each port's section selects.

The section models live beside the loader (:mod:`icefloe.config.storage`, ``.broker``,
``.groups``, ``.compactor``) rather than in the packages they configure, so that every layer
can read its configuration without importing the layers above it.
"""

from icefloe.config.loading import (
    CONFIG_PATH_ENV,
    ENV_PREFIX,
    INSTALLED,
    SECRET_MASK,
    BackendSection,
    Config,
    ResolvedBackend,
    TableSection,
    env_overrides,
    load_config,
    masked,
    parse_value,
    resolve,
    resolve_one,
)

__all__ = [
    "CONFIG_PATH_ENV",
    "ENV_PREFIX",
    "INSTALLED",
    "SECRET_MASK",
    "BackendSection",
    "Config",
    "ResolvedBackend",
    "TableSection",
    "env_overrides",
    "load_config",
    "masked",
    "parse_value",
    "resolve",
    "resolve_one",
]
