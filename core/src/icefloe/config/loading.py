"""Configuration: one TOML file, environment overrides, validation with one-line errors.

Sources, later ones winning: built-in defaults, the TOML file, then environment variables
``ICEFLOE_<SECTION>__<KEY>`` (``__`` nests: ``ICEFLOE_METADATA__ETCD__ENDPOINTS``). Values from
the environment are read as TOML values when they parse as one (``5``, ``true``,
``["a", "b"]``), otherwise as strings. ``ICEFLOE_CONFIG`` names the file.

A port's section selects its backend and holds one sub-table of options per backend, so that
switching backend is one line and several backends' settings can live side by side::

    [metadata]
    backend = "etcd"

    [metadata.etcd]
    endpoints = ["http://127.0.0.1:2379"]

Table formats are different: several are active at once (``[table] formats = ["iceberg"]``).
"""

from __future__ import annotations

import difflib
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from icefloe.config.broker import BrokerOptions
from icefloe.config.compactor import CompactorOptions
from icefloe.config.cost import CostPrices
from icefloe.config.groups import GroupOptions
from icefloe.config.metrics import MetricsOptions
from icefloe.config.quotas import QuotaOptions
from icefloe.config.schema_registry import SchemaRegistryOptions
from icefloe.config.security import SecurityOptions
from icefloe.config.storage import StorageOptions
from icefloe.errors import ConfigError, IcefloeError, PluginError
from icefloe.plugins import BackendRegistry
from icefloe.ports import PORTS
from icefloe.ports.base import BackendOptions, OpenContext, Port, PortKind
from icefloe.table_names import DEFAULT_TEMPLATE, check_template

ENV_PREFIX: Final = "ICEFLOE_"
CONFIG_PATH_ENV: Final = "ICEFLOE_CONFIG"

_SINGLE_BACKEND_PORTS: Final = (
    PortKind.METADATA,
    PortKind.OBJECT_STORE,
    PortKind.WAL,
    PortKind.COMPACTION,
)


LOCAL_STORE: Final = "local"
LOCAL_WAL: Final = "local"
OBJECT_WAL: Final = "object"


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class BackendSection(_Section):
    """A port's section: the selected backend plus per-backend option tables (extra keys).

    Subclasses set the default backend, so a file or environment that only sets options
    (``ICEFLOE_METADATA__SQLITE__POLL_INTERVAL``) keeps the default backend.
    """

    backend: str | None

    def options_for(self, name: str) -> dict[str, Any]:
        extra = self.model_extra or {}
        return dict(extra.get(name, {}))


class MetadataSection(BackendSection):
    backend: str | None = "sqlite"


class ObjectStoreSection(BackendSection):
    backend: str | None = "local"


class WalSection(BackendSection):
    """Left unset in a configuration, ``backend`` is ``local`` beside a local object store on a
    POSIX system (appending to segment files costs a flush far less than a file per WAL object)
    and ``object`` otherwise (:meth:`Config._wal_beside_the_object_store`)."""

    backend: str | None = OBJECT_WAL


class CompactionSection(BackendSection):
    """Set ``backend = ""`` to switch compaction off."""

    backend: str | None = "local"


INSTALLED: Final = "installed"


def _chosen_backend(section: Any) -> str | None:
    """The ``backend`` a section's raw value sets (``None`` when it leaves the default)."""
    if isinstance(section, BackendSection):
        return section.backend if "backend" in section.model_fields_set else None
    if isinstance(section, Mapping) and "backend" in section:
        backend = section["backend"]
        return backend if isinstance(backend, str) else ""
    return None


class TableSection(_Section):
    """Table formats to commit compacted files to, several at once.

    ``formats = "installed"`` (the default) means every table-format plugin that is installed,
    so installing ``icefloe-table-iceberg`` is all the quick start needs; ``[]`` switches
    tables off.
    """

    formats: list[str] | Literal["installed"] = INSTALLED
    identifier: str = DEFAULT_TEMPLATE
    """Each topic's table identifier, ``<namespace>.<table>`` with ``{topic}`` for the topic's
    name; a topic's ``icefloe.table.identifier`` config overrides it."""

    @model_validator(mode="before")
    @classmethod
    def _no_namespace(cls, data: Any) -> Any:
        if isinstance(data, dict) and "namespace" in data:
            raise ValueError(
                "[table] namespace is now part of [table] identifier: write "
                f'identifier = "{data["namespace"]}.{{topic}}"'
            )
        return data

    @field_validator("identifier")
    @classmethod
    def _check_identifier(cls, template: str) -> str:
        return check_template(template)

    def options_for(self, name: str) -> dict[str, Any]:
        extra = self.model_extra or {}
        return dict(extra.get(name, {}))


class Config(BaseModel):
    """The whole configuration, before backend options are validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path = Path("icefloe-data")
    metadata: MetadataSection = MetadataSection()
    object_store: ObjectStoreSection = ObjectStoreSection()
    wal: WalSection = WalSection()
    table: TableSection = TableSection()
    compaction: CompactionSection = CompactionSection()
    compactor: CompactorOptions = CompactorOptions()
    storage: StorageOptions = StorageOptions()
    broker: BrokerOptions = BrokerOptions()
    groups: GroupOptions = GroupOptions()
    metrics: MetricsOptions = MetricsOptions()
    cost: CostPrices = CostPrices()
    security: SecurityOptions = SecurityOptions()
    quotas: QuotaOptions = QuotaOptions()
    schema_registry: SchemaRegistryOptions = SchemaRegistryOptions()

    _env_names: dict[tuple[str, ...], str] = PrivateAttr(default_factory=dict)
    """The environment variable behind each key it set, so that errors found later (by
    ``resolve``) name the variable to fix."""

    @model_validator(mode="before")
    @classmethod
    def _wal_beside_the_object_store(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or _chosen_backend(data.get("wal")) is not None:
            return data
        store = _chosen_backend(data.get("object_store")) or ObjectStoreSection().backend
        if store != LOCAL_STORE or os.name != "posix":  # the local WAL needs flock and pwritev
            return data
        wal = data.get("wal")
        if isinstance(wal, WalSection):
            options = dict(wal.model_extra or {})
        elif isinstance(wal, Mapping) or wal is None:
            options = dict(wal or {})
        else:
            return data  # not a table: the field's own validation says so
        return {**data, "wal": {**options, "backend": LOCAL_WAL}}

    def section(self, kind: PortKind) -> BackendSection | TableSection:
        section: BackendSection | TableSection = getattr(self, kind.value)
        return section


P = TypeVar("P", bound=Port)


@dataclass(frozen=True)
class ResolvedBackend(Generic[P]):
    """A selected backend with its class and validated options."""

    port: type[P]
    """The port it implements (:class:`~icefloe.ports.metadata.MetadataStore`, …)."""
    name: str
    cls: type[P]
    options: BackendOptions

    @property
    def kind(self) -> PortKind:
        return self.port.kind

    async def open(self, context: OpenContext) -> P:
        return await self.cls.open(self.options, context)


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Read, merge and validate the configuration (backend options are checked by ``resolve``).

    Args:
        path: TOML file; defaults to ``$ICEFLOE_CONFIG``; no file means defaults only.
        env: Environment to read overrides from (default ``os.environ``).
        overrides: Highest-priority values, e.g. from command-line flags, as a nested dict.

    Raises:
        ConfigError: with a one-line message naming the key and the fix.
    """
    env = os.environ if env is None else env
    path = path or env.get(CONFIG_PATH_ENV)
    data: dict[str, Any] = _read_toml(Path(path)) if path else {}
    _merge(data, env_overrides(env))
    _merge(data, dict(overrides or {}))
    env_names = {tuple(path): name for name, path in _env_variables(env)}
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, data, env_names)) from None
    config._env_names = env_names
    _check_section_shapes(config)
    return config


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """The nested dict of values given by ``ICEFLOE_<SECTION>__<KEY>`` variables."""
    result: dict[str, Any] = {}
    for name, path in _env_variables(env):
        node = result
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"environment variable {name} conflicts with another variable")
        node[path[-1]] = parse_value(env[name])
    return result


def _env_variables(env: Mapping[str, str]) -> list[tuple[str, list[str]]]:
    """Each ``ICEFLOE_<SECTION>__<KEY>`` variable with the config keys it sets."""
    found = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name == CONFIG_PATH_ENV:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"environment variable {name}: empty key segment")
        found.append((name, path))
    return found


def _from_env(env_names: Mapping[tuple[str, ...], str], loc: Sequence[str]) -> str | None:
    """The environment variable that set the key at ``loc``, a table holding it or a key
    inside it, if one did."""
    loc = tuple(loc)
    for path, name in env_names.items():
        if path[: len(loc)] == loc or loc[: len(path)] == path:
            return name
    return None


def _blame(env_names: Mapping[tuple[str, ...], str], loc: Sequence[str], message: str) -> str:
    """``message``, led by the environment variable behind ``loc`` when one is: the user
    looks for the key in their file otherwise."""
    name = _from_env(env_names, loc)
    return f"environment variable {name}: {message}" if name else message


def parse_value(raw: str) -> Any:
    """A TOML value if ``raw`` is one (``5``, ``true``, ``["a"]``), else ``raw`` itself."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist (set --config or ICEFLOE_CONFIG)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value


def _describe(
    exc: ValidationError, data: Mapping[str, Any], env_names: Mapping[tuple[str, ...], str]
) -> str:
    """One line for the first validation error: the key, what is wrong, where to set it."""
    error = exc.errors()[0]
    loc = _config_path(data, [str(part) for part in error["loc"]])
    key = ".".join(loc)
    if error["type"] == "extra_forbidden":
        hint = _did_you_mean(loc[-1], _keys_of(loc[:-1]))
        what = "config section or key" if len(loc) == 1 else "config key"
        return _blame(env_names, loc, f"unknown {what} {key!r}{hint}")
    message = error["msg"].removeprefix("Value error, ")
    value = _lookup(data, loc)
    if isinstance(value, Mapping):
        return _blame(env_names, loc, f"config section [{key}]: {message}")
    shown = f" (got {value!r})" if value is not None else ""
    text = f"config key {key}: {_lower_first(message)}{shown}"
    if _from_env(env_names, loc):
        return _blame(env_names, loc, text)
    return f"{text}; set it in {_where(loc)}"


def _keys_of(loc: Sequence[str]) -> list[str]:
    """The keys the section at ``loc`` declares (the sections, for ``[]``); none if unknown."""
    model: type[BaseModel] = Config
    for part in loc:
        field = model.model_fields.get(part)
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return list(model.model_fields)


def _config_path(data: Mapping[str, Any], loc: list[str]) -> list[str]:
    """The config keys of an error location, without the type tags pydantic adds for unions."""
    path: list[str] = []
    node: Any = data
    for part in loc:
        if not isinstance(node, Mapping):
            break
        path.append(part)
        if part not in node:
            break
        node = node[part]
    return path


def _lower_first(message: str) -> str:
    """Pydantic's capitalised message as the rest of our sentence; values and names in it keep
    their case (a listener's protocol, a path)."""
    return message[:1].lower() + message[1:]


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    if not choices:
        return ""
    close = difflib.get_close_matches(word, choices, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"; {hint}valid: {', '.join(choices)}"


def _where(loc: Sequence[str]) -> str:
    table = ".".join(loc[:-1])
    file_part = f"[{table}] {loc[-1]}" if table else loc[-1]
    env_part = ENV_PREFIX + "__".join(part.upper() for part in loc)
    return f"the config file as {file_part} = … or {env_part}"


def _lookup(data: Mapping[str, Any], loc: list[str]) -> Any:
    node: Any = data
    for part in loc:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _check_section_shapes(config: Config) -> None:
    """Every extra key of a port section must be a table of backend options."""
    for kind in PortKind:
        section = config.section(kind)
        declared = list(type(section).model_fields)
        for name, value in (section.model_extra or {}).items():
            if isinstance(value, dict):
                continue
            loc = [kind.value, name]
            close = difflib.get_close_matches(name, declared, n=1)
            if close:  # a misspelt key (``backnd``), not a backend's options
                message = f"unknown config key '{kind.value}.{name}'{_did_you_mean(name, declared)}"
            else:
                message = (
                    f"config key {kind.value}.{name}: expected a table of {name!r} backend "
                    f"options ([{kind.value}.{name}]), got {value!r}; the keys of "
                    f"[{kind.value}] are {', '.join(declared)}"
                )
            raise ConfigError(_blame(config._env_names, loc, message))


def resolve(
    config: Config, port: type[P], registry: BackendRegistry | None = None
) -> list[ResolvedBackend[P]]:
    """Validate the backend(s) selected for ``port`` and their options.

    Args:
        port: The port class, e.g. ``MetadataStore``: the backends come back typed as it.

    Returns:
        One backend for single-backend ports, one per enabled format for tables.

    Raises:
        ConfigError: unknown backend name (lists the valid ones) or invalid option.
        BackendNotInstalledError: a known backend whose plugin is missing (gives the
            ``pip install``).
        PluginError: the plugin's class does not implement ``port``.
    """
    kind = port.kind
    registry = registry or BackendRegistry()
    section = config.section(kind)
    valid = registry.names(kind)
    for name in section.model_extra or {}:
        if name not in valid:
            raise ConfigError(
                _blame(
                    config._env_names,
                    [kind.value, name],
                    f"config section [{kind.value}.{name}] names no {kind.value} backend"
                    + _did_you_mean(name, valid),
                )
            )
    if isinstance(section, TableSection):
        names = (
            [b.name for b in registry.installed(kind)]
            if section.formats == INSTALLED
            else section.formats
        )
    else:
        names = [section.backend] if section.backend else []
    resolved = []
    for name in names:
        if name not in valid:
            setting = "formats" if isinstance(section, TableSection) else "backend"
            loc = [kind.value, setting]
            message = f"[{kind.value}] {setting}: {name!r} is not a {kind.value} backend" + (
                _did_you_mean(name, valid)
            )
            if _from_env(config._env_names, loc) is None:
                message += f" (set in the config file or {ENV_PREFIX}{kind.value.upper()}__"
                message += f"{setting.upper()})"
            raise ConfigError(_blame(config._env_names, loc, message))
        cls = registry.get(kind, name).load()
        if not issubclass(cls, port):
            raise PluginError(f"backend {kind}/{name}: {cls.__name__} is not a {port.__name__}")
        options = _validate_options(kind, name, cls, section, config._env_names)
        resolved.append(ResolvedBackend(port, name, cls, options))
    return resolved


def resolve_one(
    config: Config, port: type[P], registry: BackendRegistry | None = None
) -> ResolvedBackend[P]:
    """The single backend of a single-backend port.

    Raises:
        ConfigError: also when the port is switched off (no backend selected).
    """
    kind = port.kind
    if kind not in _SINGLE_BACKEND_PORTS:
        raise ValueError(f"{kind} may have several backends; use resolve()")
    chosen = resolve(config, port, registry)
    if not chosen:
        raise ConfigError(
            f"no {kind.value} backend is selected: set [{kind.value}] backend or "
            f"{ENV_PREFIX}{kind.value.upper()}__BACKEND"
        )
    return chosen[0]


def _validate_options(
    kind: PortKind,
    name: str,
    cls: type[Port],
    section: BackendSection | TableSection,
    env_names: Mapping[tuple[str, ...], str],
) -> BackendOptions:
    raw = section.options_for(name)
    try:
        return cls.options_model.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [kind.value, name, *(str(p) for p in error["loc"])]
        key = ".".join(loc)
        if error["type"] == "extra_forbidden":
            message = f"unknown option {key!r} for the {kind.value} backend {name!r}" + (
                _did_you_mean(str(error["loc"][0]), cls.options_model.model_fields)
            )
            raise ConfigError(_blame(env_names, loc, message)) from None
        value = _lookup({kind.value: {name: raw}}, loc)
        shown = f" (got {value!r})" if value is not None else ""
        message = f"config key {key}: {_lower_first(error['msg'])}{shown}"
        if _from_env(env_names, loc) is None:
            message += f"; set it in {_where(loc)}"
        raise ConfigError(_blame(env_names, loc, message)) from None


def masked(config: Config, registry: BackendRegistry | None = None) -> dict[str, Any]:
    """The effective configuration as plain data, with secrets masked, for ``config show``.

    Options of installed selected backends are shown with their defaults filled in.
    """
    data = config.model_dump(mode="json")
    registry = registry or BackendRegistry()
    for port in PORTS.values():
        try:
            backends = resolve(config, port, registry)
        except IcefloeError:
            continue  # shown as configured; `config check` reports the error
        for backend in backends:
            # SecretStr fields serialise as asterisks in JSON mode.
            data[backend.kind.value][backend.name] = backend.options.model_dump(mode="json")
    masked_data: dict[str, Any] = _mask_secret_like(data)
    return masked_data


SECRET_MASK: Final = "**********"
"""What a secret shows as; the same as pydantic's ``SecretStr``."""

_SECRET_WORDS: Final = (
    "password",
    "secret",
    "token",
    "credential",
    "access_key",
    "account_key",
    "connection_string",
    "key_id",
    "sas",
)


def _mask_secret_like(value: Any, key: str = "") -> Any:
    """Mask values under secret-sounding keys too, for options read before validation."""
    if isinstance(value, dict):
        return {k: _mask_secret_like(v, k) for k, v in value.items()}
    if value not in (None, "") and any(word in key.lower() for word in _SECRET_WORDS):
        return SECRET_MASK
    return value
