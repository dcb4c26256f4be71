"""Configuration: file, environment overrides, validation and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from icefloe import config as configuration
from icefloe.config import load_config, resolve, resolve_one
from icefloe.config.loading import Config, ObjectStoreSection, WalSection
from icefloe.embedded.sqlite_metadata import SqliteMetadataStore
from icefloe.errors import ConfigError
from icefloe.plugins import BackendRegistry, get_plugin_manager, hookimpl
from icefloe.plugins.spec import BackendSpec
from icefloe.ports import WAL, CompactionEngine, MetadataStore, TableFormat
from icefloe.ports.base import BackendOptions, PortKind


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "icefloe.toml"
    path.write_text(text)
    return path


def test_defaults_select_the_embedded_backends() -> None:
    config = load_config(env={})
    assert config.metadata.backend == "sqlite"
    assert config.object_store.backend == "local"
    assert config.wal.backend == "local"
    assert config.table.formats == "installed"


def test_the_wal_defaults_to_the_object_wal_beside_any_other_object_store(tmp_path: Path) -> None:
    assert load_config(env={"ICEFLOE_OBJECT_STORE__BACKEND": "s3"}).wal.backend == "object"
    config = load_config(write(tmp_path, '[object_store]\nbackend = "gcs"\n'), env={})
    assert config.wal.backend == "object"
    assert Config(object_store=ObjectStoreSection(backend="azure")).wal.backend == "object"


def test_a_chosen_wal_backend_stays_whatever_the_object_store(tmp_path: Path) -> None:
    assert load_config(env={"ICEFLOE_WAL__BACKEND": "object"}).wal.backend == "object"
    config = load_config(write(tmp_path, '[wal]\nbackend = "bookkeeper"\n'), env={})
    assert config.wal.backend == "bookkeeper"
    assert Config(wal=WalSection(backend="object")).wal.backend == "object"


def test_wal_options_alone_keep_the_default_backend_and_reach_it() -> None:
    config = load_config(env={"ICEFLOE_WAL__LOCAL__SEGMENT_BYTES": "1048576"})
    assert config.wal.backend == "local"
    assert config.wal.options_for("local") == {"segment_bytes": 1048576}


def test_one_line_in_the_file_selects_a_backend(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[metadata]\nbackend = "etcd"\n'), env={})
    assert config.metadata.backend == "etcd"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, '[metadata]\nbackend = "etcd"\n')
    config = load_config(path, env={"ICEFLOE_METADATA__BACKEND": "oxia"})
    assert config.metadata.backend == "oxia"


def test_environment_values_are_parsed_as_toml_values() -> None:
    env = {
        "ICEFLOE_METADATA__SQLITE__POLL_INTERVAL": "0.5",
        "ICEFLOE_TABLE__FORMATS": '["iceberg", "delta"]',
        "ICEFLOE_DATA_DIR": "/srv/icefloe",
    }
    config = load_config(env=env)
    assert config.metadata.options_for("sqlite") == {"poll_interval": 0.5}
    assert config.table.formats == ["iceberg", "delta"]
    assert config.data_dir == Path("/srv/icefloe")


def test_config_file_named_by_environment_is_read(tmp_path: Path) -> None:
    path = write(tmp_path, 'data_dir = "elsewhere"\n')
    assert load_config(env={"ICEFLOE_CONFIG": str(path)}).data_dir == Path("elsewhere")


def test_resolve_validates_backend_options() -> None:
    config = load_config(env={"ICEFLOE_METADATA__SQLITE__POLL_INTERVAL": "0.5"})
    backend = resolve_one(config, MetadataStore)
    assert backend.name == "sqlite"
    assert backend.options.poll_interval == 0.5  # type: ignore[attr-defined]


def one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_unknown_backend_lists_the_valid_choices() -> None:
    config = load_config(env={"ICEFLOE_METADATA__BACKEND": "etx"})
    with pytest.raises(ConfigError) as exc:
        resolve(config, MetadataStore)
    message = one_line(exc)
    assert "'etx'" in message
    assert "etcd, oxia, sqlite" in message
    assert "ICEFLOE_METADATA__BACKEND" in message


def test_the_bookkeeper_wal_is_a_backend_with_its_own_options() -> None:
    config = load_config(
        env={"ICEFLOE_WAL__BACKEND": "bookkeeper", "ICEFLOE_WAL__BOOKKEEPER__ENSEMBLE": "3"}
    )
    assert resolve_one(config, WAL).options.ensemble == 3


def test_unknown_top_level_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, '[metadta]\nbackend = "etcd"\n'), env={})
    message = one_line(exc)
    assert "'metadta'" in message
    assert "did you mean 'metadata'" in message


def test_unknown_backend_option_names_the_key_and_valid_options() -> None:
    config = load_config(env={"ICEFLOE_METADATA__SQLITE__POLL_INTERVALL": "1"})
    with pytest.raises(ConfigError) as exc:
        resolve(config, MetadataStore)
    message = one_line(exc)
    assert "metadata.sqlite.poll_intervall" in message
    assert "did you mean 'poll_interval'" in message


def test_wrong_type_names_the_key_the_value_and_where_to_set_it(tmp_path: Path) -> None:
    path = write(tmp_path, '[metadata.sqlite]\npoll_interval = "fast"\n')
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(path, env={}), MetadataStore)
    message = one_line(exc)
    assert "metadata.sqlite.poll_interval" in message
    assert "'fast'" in message
    assert "ICEFLOE_METADATA__SQLITE__POLL_INTERVAL" in message


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        (
            "ICEFLOE_STORAGE__MAX_BATCH_BYTES",
            "lots",
            "environment variable ICEFLOE_STORAGE__MAX_BATCH_BYTES: config key "
            "storage.max_batch_bytes: input should be a valid integer, unable to parse string as "
            "an integer (got 'lots')",
        ),
        (
            "ICEFLOE_BROKER__EVENT_LOOP",
            "trio",
            "environment variable ICEFLOE_BROKER__EVENT_LOOP: config key broker.event_loop: "
            "input should be 'auto', 'uvloop' or 'asyncio' (got 'trio')",
        ),
        (
            "ICEFLOE_COMPACTOR__TABLE_COMPRESSION",
            "lz4",
            "environment variable ICEFLOE_COMPACTOR__TABLE_COMPRESSION: config key "
            "compactor.table_compression: input should be 'zstd', 'snappy', 'gzip' or 'none' "
            "(got 'lz4')",
        ),
    ],
    ids=["integer", "choice", "codec"],
)
def test_a_wrong_environment_value_names_the_variable(
    variable: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(env={variable: value})
    assert one_line(exc) == expected


def test_an_unknown_key_in_any_section_gets_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "[storage]\nflush_interval = 5\n"), env={})
    message = one_line(exc)
    assert message.startswith("unknown config key 'storage.flush_interval'; ")
    assert "did you mean 'flush_interval_ms'?" in message
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, '[metadata]\nbacknd = "etcd"\n'), env={})
    assert "unknown config key 'metadata.backnd'; did you mean 'backend'?" in one_line(exc)


def test_an_unknown_key_from_the_environment_names_the_variable_and_a_suggestion() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(env={"ICEFLOE_BROKER__PORTT": "9092"})
    message = one_line(exc)
    assert message.startswith("environment variable ICEFLOE_BROKER__PORTT: ")
    assert "unknown config key 'broker.portt'; did you mean 'port'?" in message


def test_an_unknown_plugin_option_gets_a_suggestion_from_the_file_or_the_environment(
    tmp_path: Path,
) -> None:
    path = write(tmp_path, '[metadata]\nbackend = "etcd"\n[metadata.etcd]\nendpoint = ["x:1"]\n')
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(path, env={}), MetadataStore)
    message = one_line(exc)
    assert message.startswith("unknown option 'metadata.etcd.endpoint'")
    assert "did you mean 'endpoints'?" in message
    env = {"ICEFLOE_METADATA__BACKEND": "etcd", "ICEFLOE_METADATA__ETCD__ENDPOINT": "x:1"}
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(env=env), MetadataStore)
    message = one_line(exc)
    assert message.startswith("environment variable ICEFLOE_METADATA__ETCD__ENDPOINT: ")
    assert "did you mean 'endpoints'?" in message


def test_a_wrong_plugin_option_value_from_the_environment_names_the_variable() -> None:
    env = {"ICEFLOE_METADATA__SQLITE__POLL_INTERVAL": "fast"}
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(env=env), MetadataStore)
    message = one_line(exc)
    assert message.startswith("environment variable ICEFLOE_METADATA__SQLITE__POLL_INTERVAL: ")
    assert "metadata.sqlite.poll_interval" in message


def test_a_misspelt_backend_gets_a_suggestion_and_names_the_variable(tmp_path: Path) -> None:
    path = write(tmp_path, '[metadata.etdc]\nendpoints = ["x:1"]\n')
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(path, env={}), MetadataStore)
    assert "[metadata.etdc] names no metadata backend; did you mean 'etcd'?" in one_line(exc)
    config = load_config(env={"ICEFLOE_METADATA__BACKEND": "etdc"})
    with pytest.raises(ConfigError) as exc:
        resolve(config, MetadataStore)
    assert one_line(exc) == (
        "environment variable ICEFLOE_METADATA__BACKEND: [metadata] backend: 'etdc' is not a "
        "metadata backend; did you mean 'etcd'? valid: etcd, oxia, sqlite"
    )


def test_a_backend_key_under_table_names_the_keys_table_has(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, '[table]\nbackend = "delta"\n'), env={})
    assert one_line(exc).endswith("the keys of [table] are formats, identifier")


def test_wrong_type_of_a_core_key_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "[table]\nformats = 3\n"), env={})
    message = one_line(exc)
    assert "table.formats" in message
    assert "3" in message


def test_options_table_for_an_unknown_backend_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, '[metadata.zookeeper]\nhosts = "x"\n')
    with pytest.raises(ConfigError) as exc:
        resolve(load_config(path, env={}), MetadataStore)
    message = one_line(exc)
    assert "[metadata.zookeeper]" in message
    assert "sqlite" in message


def test_a_scalar_where_an_options_table_belongs_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, '[metadata]\nsqlite = "x"\n'), env={})
    assert "metadata.sqlite" in one_line(exc)


def test_invalid_toml_is_reported_with_the_file_name(tmp_path: Path) -> None:
    path = write(tmp_path, "[metadata\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, env={})
    assert str(path) in one_line(exc)


def test_missing_config_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(tmp_path / "nope.toml", env={})
    assert "does not exist" in one_line(exc)


def test_tables_default_to_every_installed_format() -> None:
    installed = {b.name for b in BackendRegistry().installed(PortKind.TABLE)}
    chosen = {b.name for b in resolve(load_config(env={}), TableFormat)}
    assert chosen == installed


def test_tables_can_be_switched_off() -> None:
    assert resolve(load_config(env={"ICEFLOE_TABLE__FORMATS": "[]"}), TableFormat) == []


def test_compaction_runs_in_process_by_default() -> None:
    assert resolve_one(load_config(env={}), CompactionEngine).name == "local"


def test_compaction_can_be_switched_off() -> None:
    config = load_config(env={"ICEFLOE_COMPACTION__BACKEND": ""})
    assert resolve(config, CompactionEngine) == []
    with pytest.raises(ConfigError, match="ICEFLOE_COMPACTION__BACKEND"):
        resolve_one(config, CompactionEngine)


class SecretOptions(BackendOptions):
    endpoint: str = "http://127.0.0.1:1"
    password: SecretStr = SecretStr("")


class SecretStore(SqliteMetadataStore):
    """A metadata adapter with a password option, registered by an in-test plugin."""

    options_model = SecretOptions


class SecretPlugin:
    @hookimpl
    def icefloe_register_backends(self) -> list[BackendSpec]:
        return [BackendSpec(PortKind.METADATA, "secretive", f"{__name__}:SecretStore", "test")]


def test_config_show_masks_secrets(tmp_path: Path) -> None:
    registry = BackendRegistry(get_plugin_manager(extra_plugins=[SecretPlugin()]))
    path = write(
        tmp_path, '[metadata]\nbackend = "secretive"\n[metadata.secretive]\npassword = "hunter2"\n'
    )
    shown = configuration.masked(load_config(path, env={}), registry)
    assert shown["metadata"]["secretive"]["password"] == "**********"
    assert shown["metadata"]["secretive"]["endpoint"] == "http://127.0.0.1:1"
    assert "hunter2" not in repr(shown)


def test_a_batch_limit_over_the_topic_ceiling_names_both_settings() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(env={"ICEFLOE_STORAGE__MAX_BATCH_BYTES": str(32 << 20)})
    message = one_line(exc)
    assert "max_batch_bytes (33554432)" in message
    assert "max_topic_batch_bytes (16777216)" in message
