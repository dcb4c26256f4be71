"""Topic configs: Kafka's validation, defaults from broker settings, incremental changes."""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from icefloe.config.storage import StorageOptions
from icefloe.topics import configs as topic_configs
from icefloe.topics.configs import AlterOp, ConfigSource, ConfigType
from icefloe.topics.registry import TopicError

DEFAULTS = StorageOptions()


def refusal(name: str, value: str | None) -> TopicError:
    with pytest.raises(TopicError) as caught:
        topic_configs.validate_value(name, value)
    return caught.value


def test_an_unknown_key_is_invalid_config_naming_the_valid_keys() -> None:
    error = refusal("retention.mss", "1")
    assert error.error_code == ErrorCode.invalid_config
    assert "retention.mss" in str(error)
    assert "did you mean retention.ms?" in str(error)
    assert all(name in str(error) for name in topic_configs.TOPIC_CONFIGS)


def test_a_non_number_is_invalid_config_naming_the_key_and_the_type() -> None:
    error = refusal("retention.ms", "a week")
    assert error.error_code == ErrorCode.invalid_config
    assert str(error) == (
        "Invalid value a week for configuration retention.ms: "
        "expected a 64-bit integer of at least -1"
    )


def test_a_number_below_the_minimum_is_refused() -> None:
    assert refusal("retention.ms", "-2").error_code == ErrorCode.invalid_config


def test_an_int_config_refuses_values_beyond_32_bits() -> None:
    assert refusal("max.message.bytes", str(2**31)).error_code == ErrorCode.invalid_config


def test_numbers_are_stored_trimmed() -> None:
    assert topic_configs.validate_value("retention.ms", " 1000 ") == "1000"


def test_a_choice_outside_the_accepted_values_names_them() -> None:
    error = refusal("message.timestamp.type", "createtime")
    assert "expected one of CreateTime, LogAppendTime" in str(error)


@pytest.mark.parametrize("codec", ["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"])
def test_every_kafka_compression_type_is_accepted(codec: str) -> None:
    assert topic_configs.validate_value("compression.type", codec) == codec


@pytest.mark.parametrize("codec", ["zstd", "snappy", "gzip", "none"])
def test_every_table_codec_is_accepted(codec: str) -> None:
    assert topic_configs.validate_value("icefloe.table.compression", codec) == codec


def test_a_table_codec_parquet_readers_may_lack_is_refused_naming_the_choices() -> None:
    error = refusal("icefloe.table.compression", "lz4")
    assert error.error_code == ErrorCode.invalid_config
    assert "expected one of zstd, snappy, gzip, none" in str(error)


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("delete", "delete"),
        ("compact", "compact"),
        (" compact , delete ", "compact,delete"),
        ("delete,delete", "delete"),
        ("", ""),
    ],
)
def test_cleanup_policy_accepts_what_kafka_accepts(given: str, stored: str) -> None:
    assert topic_configs.validate_value("cleanup.policy", given) == stored


def test_cleanup_policy_refuses_other_policies() -> None:
    error = refusal("cleanup.policy", "delete,archive")
    assert "expected a comma-separated list of delete, compact" in str(error)


def test_a_null_value_is_invalid_config() -> None:
    assert refusal("retention.ms", None).error_code == ErrorCode.invalid_config


def test_segment_settings_are_accepted_although_they_have_no_effect() -> None:
    assert topic_configs.validate({"segment.bytes": "1048576", "segment.ms": "1"}, DEFAULTS) == {
        "segment.bytes": "1048576",
        "segment.ms": "1",
    }


def test_every_config_is_documented() -> None:
    assert all(key.documentation for key in topic_configs.TOPIC_CONFIGS.values())


def test_describe_lists_every_config_with_its_default_source() -> None:
    entries = topic_configs.describe({}, DEFAULTS)
    assert [e.name for e in entries] == sorted(topic_configs.TOPIC_CONFIGS)
    assert {e.source for e in entries} == {ConfigSource.DEFAULT_CONFIG}


def test_a_config_set_on_the_topic_comes_first_and_keeps_the_default_as_synonym() -> None:
    entry = _entry(topic_configs.describe({"retention.ms": "1000"}, DEFAULTS), "retention.ms")
    assert (entry.value, entry.source, entry.type) == (
        "1000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG,
        ConfigType.LONG,
    )
    assert [(s.value, s.source) for s in entry.synonyms] == [
        ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG),
        ("604800000", ConfigSource.DEFAULT_CONFIG),
    ]


def test_max_message_bytes_defaults_to_the_storage_batch_limit() -> None:
    storage = StorageOptions(max_batch_bytes=5000)
    entry = _entry(topic_configs.describe({}, storage), "max.message.bytes")
    assert (entry.value, entry.source) == ("5000", ConfigSource.STATIC_BROKER_CONFIG)
    assert entry.synonyms[0].name == "message.max.bytes"


def test_a_topic_may_raise_max_message_bytes_up_to_the_cluster_limit() -> None:
    storage = StorageOptions(max_batch_bytes=1000, max_topic_batch_bytes=5000)
    assert topic_configs.validate({"max.message.bytes": "5000"}, storage) == {
        "max.message.bytes": "5000"
    }
    assert topic_configs.batch_limit({"max.message.bytes": "5000"}, storage) == 5000
    assert topic_configs.batch_limit({"max.message.bytes": "500"}, storage) == 500
    assert topic_configs.batch_limit({}, storage) == 1000
    with pytest.raises(TopicError) as caught:
        topic_configs.validate({"max.message.bytes": "5001"}, storage)
    assert caught.value.error_code == ErrorCode.invalid_config
    assert str(caught.value) == (
        "max.message.bytes 5001 is over this cluster's limit of 5000 bytes "
        "([storage] max_topic_batch_bytes)"
    )


def test_an_incremental_change_over_the_cluster_limit_is_refused() -> None:
    storage = StorageOptions(max_batch_bytes=1000, max_topic_batch_bytes=5000)
    change = [("max.message.bytes", AlterOp.SET, "6000")]
    with pytest.raises(TopicError) as caught:
        topic_configs.alter_incrementally({}, change, storage)
    assert caught.value.error_code == ErrorCode.invalid_config


def test_a_value_stored_before_the_limit_was_lowered_is_capped_by_it() -> None:
    storage = StorageOptions(max_batch_bytes=1000, max_topic_batch_bytes=2000)
    assert topic_configs.batch_limit({"max.message.bytes": "9000"}, storage) == 2000


def test_max_message_bytes_default_is_a_default_when_storage_leaves_it_unset() -> None:
    entry = _entry(topic_configs.describe({}, DEFAULTS), "max.message.bytes")
    assert (entry.value, entry.source) == (
        str(DEFAULTS.max_batch_bytes),
        ConfigSource.DEFAULT_CONFIG,
    )


def test_incremental_set_and_delete() -> None:
    changed = topic_configs.alter_incrementally(
        {"retention.ms": "1", "segment.ms": "5"},
        [("retention.ms", AlterOp.SET, "2"), ("segment.ms", AlterOp.DELETE, None)],
        DEFAULTS,
    )
    assert changed == {"retention.ms": "2"}


def test_incremental_append_starts_from_the_default_and_skips_present_items() -> None:
    changed = topic_configs.alter_incrementally(
        {}, [("cleanup.policy", AlterOp.APPEND, "compact,delete")], DEFAULTS
    )
    assert changed == {"cleanup.policy": "delete,compact"}


def test_incremental_subtract_removes_items() -> None:
    changed = topic_configs.alter_incrementally(
        {"cleanup.policy": "delete,compact"},
        [("cleanup.policy", AlterOp.SUBTRACT, "delete")],
        DEFAULTS,
    )
    assert changed == {"cleanup.policy": "compact"}


@pytest.mark.parametrize("op", [AlterOp.APPEND, AlterOp.SUBTRACT])
def test_append_and_subtract_are_refused_on_configs_that_are_not_lists(op: AlterOp) -> None:
    with pytest.raises(TopicError) as caught:
        topic_configs.alter_incrementally({}, [("retention.ms", op, "1")], DEFAULTS)
    assert caught.value.error_code == ErrorCode.invalid_config
    assert "retention.ms" in str(caught.value)


def test_incremental_delete_of_an_unknown_key_is_invalid_config() -> None:
    with pytest.raises(TopicError) as caught:
        topic_configs.alter_incrementally({}, [("nope", AlterOp.DELETE, None)], DEFAULTS)
    assert caught.value.error_code == ErrorCode.invalid_config


def _entry(entries: list[topic_configs.ConfigEntry], name: str) -> topic_configs.ConfigEntry:
    return next(e for e in entries if e.name == name)


@pytest.mark.parametrize(
    "name", [topic_configs.VALUE_SCHEMA_CONFIG, topic_configs.KEY_SCHEMA_CONFIG]
)
def test_registry_mode_without_the_decoders_installed_names_the_install(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    packages = (*topic_configs.SCHEMA_PACKAGES, "icefloe_absent.decoder")
    monkeypatch.setattr(topic_configs, "SCHEMA_PACKAGES", packages)
    assert topic_configs.validate_value(name, "raw") == "raw"
    with pytest.raises(TopicError) as refused:
        topic_configs.validate_value(name, "registry")
    assert refused.value.error_code == ErrorCode.invalid_config
    assert "icefloe_absent.decoder" in str(refused.value)
    assert "pip install 'icefloe[schemas]'" in str(refused.value)


def test_registry_mode_is_accepted_where_the_decoders_are_installed() -> None:
    name = topic_configs.VALUE_SCHEMA_CONFIG
    assert topic_configs.validate_value(name, " registry ") == "registry"
    with pytest.raises(TopicError):
        topic_configs.validate_value(name, "Registry")
