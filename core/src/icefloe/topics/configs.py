"""The topic configs Icefloe knows: names, types, defaults, validation and documentation.

A topic record stores only the configs set on the topic (Kafka's dynamic topic configs); every
other config takes its default when it is read, so a default that comes from the broker's
settings (``max.message.bytes`` from ``storage.max_batch_bytes``) follows the configuration.
Values are validated as Apache Kafka validates them and stored normalised (trimmed; lists
without duplicates), so that what DescribeConfigs returns is exactly what was accepted.

Several configs are accepted for compatibility and have no effect yet: tools such as Kafka
Streams, Kafka Connect and Debezium set them when they create topics, and refusing them would
break those tools. Each one's documentation says so.
"""

from __future__ import annotations

import difflib
import enum
import importlib.util
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from kio.schema.errors import ErrorCode

from icefloe.config.compactor import CompactorOptions, TableCodec
from icefloe.config.storage import StorageOptions
from icefloe.ports.table import TimePartition
from icefloe.storage.batch import Compression
from icefloe.table_names import IDENTIFIER_CONFIG, check_template
from icefloe.topics.registry import TIME_PARTITION, TopicError

MAX_AGE_CONFIG: Final = "icefloe.compaction.max.age.ms"
MIN_BYTES_CONFIG: Final = "icefloe.compaction.min.bytes"
"""Topic configs that override ``[compactor] max_age_s`` and ``min_bytes`` for one topic."""
REWRITE_TARGET_CONFIG: Final = "icefloe.table.rewrite.target.bytes"
REWRITE_MIN_FILES_CONFIG: Final = "icefloe.table.rewrite.min.files"
HISTORY_CONFIG: Final = "icefloe.table.history.ms"
ORPHAN_AGE_CONFIG: Final = "icefloe.table.orphan.age.ms"
"""Topic configs of table maintenance (defaults in ``[compactor]``)."""
TABLE_IDENTIFIER_CONFIG: Final = IDENTIFIER_CONFIG
"""The topic's own table identifier (an alias); empty: the cluster's ``[table] identifier``."""
TIME_PARTITION_CONFIG: Final = TIME_PARTITION
"""``none``, ``hour`` or ``day``: also partition the topic's tables by the record timestamp."""
TABLE_RETENTION_CONFIG: Final = "icefloe.table.retention"
TABLE_COMPRESSION_CONFIG: Final = "icefloe.table.compression"
KEY_SCHEMA_CONFIG: Final = "icefloe.table.key.schema"
VALUE_SCHEMA_CONFIG: Final = "icefloe.table.value.schema"
"""``raw`` (the bytes only) or ``registry``: decode the key (value) into typed table columns
by the schema id of its Confluent wire-format header (docs/typed-columns.md)."""
MAX_MESSAGE_BYTES_CONFIG: Final = "max.message.bytes"
TIMESTAMP_TYPE_CONFIG: Final = "message.timestamp.type"
COMPRESSION_CONFIG: Final = "compression.type"
_CODECS: Final = {
    "uncompressed": Compression.NONE,
    "zstd": Compression.ZSTD,
    "lz4": Compression.LZ4,
    "snappy": Compression.SNAPPY,
    "gzip": Compression.GZIP,
}
LOG_APPEND_TIME: Final = "LogAppendTime"
"""``keep`` (rows stay in the tables after retention) or ``delete`` (they leave them too)."""

_INT_RANGE: Final = (-(2**31), 2**31 - 1)
_LONG_RANGE: Final = (-(2**63), 2**63 - 1)


class ConfigType(enum.IntEnum):
    """Kafka's config types, as DescribeConfigs (v3+) reports them."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7


class ConfigSource(enum.IntEnum):
    """Where a config's value comes from, as DescribeConfigs and CreateTopics report it."""

    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class AlterOp(enum.IntEnum):
    """IncrementalAlterConfigs operations (KIP-339)."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config as DescribeConfigs shows it (topic and broker resources alike)."""

    name: str
    value: str | None
    source: ConfigSource
    type: ConfigType
    documentation: str
    synonyms: tuple[Synonym, ...]
    """Every level that defines the config, the one in effect first (Kafka's order)."""
    read_only: bool = False
    sensitive: bool = False


class _Rule(Protocol):
    @property
    def type(self) -> ConfigType: ...

    @property
    def accepted(self) -> str:
        """The accepted values, for error messages."""

    def normalise(self, text: str) -> str:
        """``text`` as stored; raises ``ValueError`` if it is not accepted."""


@dataclass(frozen=True, slots=True)
class _Number:
    type: ConfigType
    minimum: int

    @property
    def accepted(self) -> str:
        bits = 32 if self.type is ConfigType.INT else 64
        if self.minimum == self._range[0]:
            return f"a {bits}-bit integer"
        return f"a {bits}-bit integer of at least {self.minimum}"

    @property
    def _range(self) -> tuple[int, int]:
        return _INT_RANGE if self.type is ConfigType.INT else _LONG_RANGE

    def normalise(self, text: str) -> str:
        number = int(text.strip())  # ValueError if not a number; Kafka's parseInt trims too
        if not self.minimum <= number <= self._range[1]:
            raise ValueError(f"{number} is out of range")
        return str(number)


@dataclass(frozen=True, slots=True)
class _Fraction:
    """Kafka's ``Range.between(0, 1)`` on a double."""

    type: ConfigType = ConfigType.DOUBLE

    @property
    def accepted(self) -> str:
        return "a number between 0 and 1"

    def normalise(self, text: str) -> str:
        number = float(text.strip())  # ValueError if not a number
        if not 0.0 <= number <= 1.0:  # also refuses NaN
            raise ValueError(f"{number} is out of range")
        return repr(number)


@dataclass(frozen=True, slots=True)
class _OneOf:
    """Kafka's ``ValidString.in(...)``: exactly one of the choices, case-sensitive."""

    choices: tuple[str, ...]
    type: ConfigType = ConfigType.STRING

    @property
    def accepted(self) -> str:
        return "one of " + ", ".join(self.choices)

    def normalise(self, text: str) -> str:
        value = text.strip()
        if value not in self.choices:
            raise ValueError(value)
        return value


SCHEMA_PACKAGES: Final = ("fastavro", "jsonschema", "google.protobuf", "grpc_tools")
"""What decoding records into typed columns needs (the ``icefloe[schemas]`` extra)."""


@dataclass(frozen=True, slots=True)
class _SchemaMode:
    """``raw`` or ``registry``; ``registry`` only where the decoders are installed, since
    records compacted without them could only become dead letters."""

    type: ConfigType = ConfigType.STRING
    accepted: str = "one of raw, registry"

    def normalise(self, text: str) -> str:
        value = _OneOf(("raw", "registry")).normalise(text)
        missing = [name for name in SCHEMA_PACKAGES if not _installed(name)]
        if value == "registry" and missing:
            raise TopicError(
                ErrorCode.invalid_config,
                f"registry mode decodes records with {', '.join(missing)}, which are not "
                "installed: pip install 'icefloe[schemas]'",
            )
        return value


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


@dataclass(frozen=True, slots=True)
class _ListOf:
    """Kafka's ``ValidList.in(...)``: a comma-separated list of the choices (may be empty)."""

    choices: tuple[str, ...]
    type: ConfigType = ConfigType.LIST

    @property
    def accepted(self) -> str:
        return "a comma-separated list of " + ", ".join(self.choices)

    def normalise(self, text: str) -> str:
        items = split_list(text)
        if any(item not in self.choices for item in items):
            raise ValueError(text)
        return ",".join(dict.fromkeys(items))


@dataclass(frozen=True, slots=True)
class _Identifier:
    """A table identifier template (:mod:`icefloe.topics.table_names`), or empty."""

    type: ConfigType = ConfigType.STRING

    @property
    def accepted(self) -> str:
        return "a table identifier such as sales.orders or analytics.{topic}, or empty"

    def normalise(self, text: str) -> str:
        return check_template(text) if text.strip() else ""


@dataclass(frozen=True, slots=True)
class BrokerDefault:
    """A broker setting that provides a topic config's default."""

    kafka_name: str
    """The broker config Kafka would report as the synonym, e.g. ``message.max.bytes``."""
    setting: str
    """The Icefloe option under ``[storage]`` that sets it, e.g. ``max_batch_bytes``."""

    def value(self, storage: StorageOptions) -> str:
        return str(getattr(storage, self.setting))

    def source(self, storage: StorageOptions) -> ConfigSource:
        if self.setting in storage.model_fields_set:
            return ConfigSource.STATIC_BROKER_CONFIG
        return ConfigSource.DEFAULT_CONFIG


@dataclass(frozen=True, slots=True)
class ConfigKey:
    name: str
    rule: _Rule
    default: str
    """The built-in default; a broker setting, where there is one, overrides it."""
    documentation: str
    broker_default: BrokerDefault | None = None

    @property
    def type(self) -> ConfigType:
        return self.rule.type

    def default_value(self, storage: StorageOptions) -> str:
        if self.broker_default is not None:
            return self.broker_default.value(storage)
        return self.default


_LATER = " Accepted and stored; Icefloe does not enforce it yet."
_NO_EFFECT = (
    " Accepted for compatibility and has no effect: Icefloe has no log segments (data lives in "
    "WAL objects, then Parquet files)."
)
CLEANUP_POLICY_CONFIG: Final = "cleanup.policy"
DELETE_RETENTION_CONFIG: Final = "delete.retention.ms"
MIN_COMPACTION_LAG_CONFIG: Final = "min.compaction.lag.ms"
MAX_COMPACTION_LAG_CONFIG: Final = "max.compaction.lag.ms"
DIRTY_RATIO_CONFIG: Final = "min.cleanable.dirty.ratio"
_LOG_COMPACTION = (
    " Log compaction works on the topic's data files (Parquet), so records still in the "
    "write-ahead log wait for compaction into Parquet first (icefloe.compaction.max.age.ms)."
)

TOPIC_CONFIGS: Final[Mapping[str, ConfigKey]] = {
    key.name: key
    for key in sorted(
        (
            ConfigKey(
                "retention.ms",
                _Number(ConfigType.LONG, -1),
                str(7 * 24 * 3600 * 1000),
                "How long records stay readable by Kafka consumers, in milliseconds; -1 keeps "
                "them forever. Rows in the topic's tables stay there unless "
                "icefloe.table.retention is delete.",
            ),
            ConfigKey(
                "retention.bytes",
                _Number(ConfigType.LONG, _LONG_RANGE[0]),
                "-1",
                "Largest size a partition may grow to before its oldest records stop being "
                "readable by Kafka consumers; -1 means no limit. Rows in the topic's tables stay "
                "there unless icefloe.table.retention is delete.",
            ),
            ConfigKey(
                CLEANUP_POLICY_CONFIG,
                _ListOf(("delete", "compact")),
                "delete",
                "delete: drop records older than retention.ms or beyond retention.bytes; "
                "compact: keep the latest record per key (producers must give every record a "
                "key); compact,delete: both." + _LOG_COMPACTION,
            ),
            ConfigKey(
                DIRTY_RATIO_CONFIG,
                _Fraction(),
                "0.5",
                "A compacted partition is cleaned once the bytes of its data files not yet "
                "cleaned are at least this fraction of all its data files' bytes (or "
                "max.compaction.lag.ms has passed, or a kept tombstone's delete.retention.ms "
                "has)." + _LOG_COMPACTION,
            ),
            ConfigKey(
                MAX_COMPACTION_LAG_CONFIG,
                _Number(ConfigType.LONG, 1),
                str(_LONG_RANGE[1]),
                "Longest time a record may stay uncleaned on a compacted topic, in "
                "milliseconds (counted from its timestamp): a partition whose oldest uncleaned "
                "record is older is cleaned whatever min.cleanable.dirty.ratio says.",
            ),
            ConfigKey(
                MAX_MESSAGE_BYTES_CONFIG,
                _Number(ConfigType.INT, 0),
                str(StorageOptions.model_fields["max_batch_bytes"].default),
                "Largest record batch a producer may send to this topic; the default is the "
                "broker's message.max.bytes ([storage] max_batch_bytes), and a topic may set "
                "it higher, up to [storage] max_topic_batch_bytes.",
                BrokerDefault("message.max.bytes", "max_batch_bytes"),
            ),
            ConfigKey(
                TIMESTAMP_TYPE_CONFIG,
                _OneOf(("CreateTime", LOG_APPEND_TIME)),
                "CreateTime",
                "CreateTime keeps the producer's record timestamps; LogAppendTime replaces them "
                "with the broker's time when the batch is appended.",
            ),
            ConfigKey(
                COMPRESSION_CONFIG,
                _OneOf((*_CODECS, "producer")),
                "producer",
                "The compression of stored batches; producer keeps what the producer sent, "
                "another codec has the broker recompress batches that use a different one.",
            ),
            ConfigKey(
                "segment.bytes",
                _Number(ConfigType.INT, 1 << 20),
                str(1 << 30),
                "Kafka's log segment size." + _NO_EFFECT,
            ),
            ConfigKey(
                "segment.ms",
                _Number(ConfigType.LONG, 1),
                str(7 * 24 * 3600 * 1000),
                "Kafka's log segment roll time." + _NO_EFFECT,
            ),
            ConfigKey(
                MAX_AGE_CONFIG,
                _Number(ConfigType.LONG, 0),
                str(int(CompactorOptions.model_fields["max_age_s"].default * 1000)),
                "Compact this topic's stream into its tables once its oldest uncompacted record "
                "is this old, in milliseconds (the broker-wide default is [compactor] "
                "max_age_s).",
            ),
            ConfigKey(
                MIN_BYTES_CONFIG,
                _Number(ConfigType.LONG, 1),
                str(CompactorOptions.model_fields["min_bytes"].default),
                "Compact this topic's stream into its tables once this many bytes wait in the "
                "write-ahead log (the broker-wide default is [compactor] min_bytes).",
            ),
            ConfigKey(
                REWRITE_TARGET_CONFIG,
                _Number(ConfigType.LONG, 0),
                str(CompactorOptions.model_fields["rewrite_target_bytes"].default),
                "Table maintenance merges this topic's consecutive small data files (each under "
                "three quarters of this size) into files of up to this size, in the tables and "
                "for Kafka reads alike; 0 switches it off (broker-wide: [compactor] "
                "rewrite_target_bytes).",
            ),
            ConfigKey(
                REWRITE_MIN_FILES_CONFIG,
                _Number(ConfigType.INT, 2),
                str(CompactorOptions.model_fields["rewrite_min_files"].default),
                "How many consecutive small data files of a partition make a rewrite worth it "
                "(broker-wide: [compactor] rewrite_min_files).",
            ),
            ConfigKey(
                HISTORY_CONFIG,
                _Number(ConfigType.LONG, 0),
                str(int(CompactorOptions.model_fields["history_retention_s"].default * 1000)),
                "How long the topic's table snapshots (Iceberg) and versions (Delta) are kept "
                "for time travel, in milliseconds; data files the tables no longer use are "
                "deleted this long after (broker-wide: [compactor] history_retention_s).",
            ),
            ConfigKey(
                ORPHAN_AGE_CONFIG,
                _Number(ConfigType.LONG, -1),
                str(int(CompactorOptions.model_fields["orphan_age_s"].default * 1000)),
                "Files under the topic's table root that no index entry, table or unfinished "
                "task references are deleted once this old, in milliseconds; -1 keeps them "
                "(broker-wide: [compactor] orphan_age_s).",
            ),
            ConfigKey(
                TABLE_IDENTIFIER_CONFIG,
                _Identifier(),
                "",
                "The identifier of the topic's table in every catalog, '<namespace>.<table>' "
                "({topic} stands for the topic's name with '.' as '_'); empty takes the "
                "cluster's [table] identifier (icefloe.{topic} by default). Files stay where "
                "they are when it changes; an Iceberg table is found under the new name only "
                "once it is renamed in the catalog.",
            ),
            ConfigKey(
                TIME_PARTITION_CONFIG,
                _OneOf(("none", "hour", "day")),
                "none",
                "hour or day: the topic's tables are partitioned by the hour (day) of the record "
                "timestamp as well as by Kafka partition, so queries on a time range read only "
                "its files. Set when the topic is created; it cannot change afterwards.",
            ),
            ConfigKey(
                TABLE_COMPRESSION_CONFIG,
                _OneOf(tuple(codec.value for codec in TableCodec)),
                CompactorOptions.model_fields["table_compression"].default.value,
                "The codec of the record columns in the data files written for the topic's "
                "tables: zstd makes the smallest files, snappy larger ones that catch-up reads "
                "from Parquet decode with less CPU, gzip and none are there for readers that "
                "need them. Files already written keep their codec (broker-wide: [compactor] "
                "table_compression).",
            ),
            ConfigKey(
                TABLE_RETENTION_CONFIG,
                _OneOf(("keep", "delete")),
                "keep",
                "keep: rows stay in the topic's tables after retention.ms or retention.bytes "
                "removes them from the stream; delete: the data files retention removes from "
                "the stream leave the tables too (a whole file at a time, once its newest "
                "record is past retention).",
            ),
            ConfigKey(
                KEY_SCHEMA_CONFIG,
                _SchemaMode(),
                "raw",
                "raw: the topic's tables hold record keys as bytes only; registry: keys in the "
                "Confluent wire format (a schema id, then Avro, JSON or Protobuf) are also "
                "decoded by their registered schema into the key_fields column as the records "
                "are compacted.",
            ),
            ConfigKey(
                VALUE_SCHEMA_CONFIG,
                _SchemaMode(),
                "raw",
                "raw: the topic's tables hold record values as bytes only; registry: values in "
                "the Confluent wire format (a schema id, then Avro, JSON or Protobuf) are also "
                "decoded by their registered schema into the value_fields column as the records "
                "are compacted; a value that does not decode keeps a null value_fields and its "
                "reason in value_error (the topic's dead letters).",
            ),
            ConfigKey(
                "min.insync.replicas",
                _Number(ConfigType.INT, 1),
                "1",
                "Accepted for compatibility and has no effect: Icefloe keeps no replicas; an "
                "acknowledged write is already durable in the write-ahead log.",
            ),
            ConfigKey(
                DELETE_RETENTION_CONFIG,
                _Number(ConfigType.LONG, 0),
                str(24 * 3600 * 1000),
                "How long delete markers (tombstones: records with a null value) stay on a "
                "compacted topic, in milliseconds from the tombstone's timestamp.",
            ),
            ConfigKey(
                MIN_COMPACTION_LAG_CONFIG,
                _Number(ConfigType.LONG, 0),
                "0",
                "Minimum age of a record, from its timestamp, before log compaction may "
                "remove it (a data file is cleaned only once its newest record is this old).",
            ),
        ),
        key=lambda k: k.name,
    )
}


def time_partition(configs: Mapping[str, str]) -> TimePartition | None:
    """The time partitioning of a topic's tables, from its configs."""
    value = configs.get(TIME_PARTITION_CONFIG, "none")
    return None if value == "none" else TimePartition(value)


def table_codec(configs: Mapping[str, str], options: CompactorOptions) -> str:
    """The codec of the data files of a topic with ``configs``: its own, else the
    broker-wide one."""
    return configs.get(TABLE_COMPRESSION_CONFIG, options.table_compression.value)


def typed_sides(configs: Mapping[str, str]) -> tuple[str, ...]:
    """The sides (``"key"``, ``"value"``) a topic with ``configs`` decodes into typed columns."""
    return tuple(
        side
        for side, name in (("key", KEY_SCHEMA_CONFIG), ("value", VALUE_SCHEMA_CONFIG))
        if configs.get(name, "raw") == "registry"
    )


def is_compacted(configs: Mapping[str, str]) -> bool:
    """Whether a topic with ``configs`` is log-compacted (``cleanup.policy`` has ``compact``)."""
    return "compact" in split_list(configs.get(CLEANUP_POLICY_CONFIG, "delete"))


def split_list(text: str) -> list[str]:
    """A list config's items: comma-separated, trimmed, empty items dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def config_key(name: str) -> ConfigKey:
    """The known config ``name``.

    Raises:
        TopicError: ``invalid_config`` naming the valid keys.
    """
    key = TOPIC_CONFIGS.get(name)
    if key is None:
        close = difflib.get_close_matches(name, TOPIC_CONFIGS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise TopicError(
            ErrorCode.invalid_config,
            f"Unknown topic config name: {name}; {hint}valid names: {', '.join(TOPIC_CONFIGS)}",
        )
    return key


def validate_value(name: str, value: str | None) -> str:
    """``value`` normalised as it is stored.

    Raises:
        TopicError: ``invalid_config`` naming the key and the accepted values.
    """
    key = config_key(name)
    if value is None:
        raise TopicError(
            ErrorCode.invalid_config, f"Null value not supported for topic configs: {name}"
        )
    try:
        return key.rule.normalise(value)
    except ValueError:
        raise TopicError(
            ErrorCode.invalid_config,
            f"Invalid value {value} for configuration {name}: expected {key.rule.accepted}",
        ) from None


def validate(configs: Mapping[str, str | None], storage: StorageOptions) -> dict[str, str]:
    """A whole set of topic configs, normalised.

    Raises:
        TopicError: ``invalid_config`` for the first unknown key or bad value, or a value
            this cluster's settings cannot honour.
    """
    valid = {name: validate_value(name, value) for name, value in configs.items()}
    check_limits(valid, storage)
    return valid


def check_limits(configs: Mapping[str, str], storage: StorageOptions) -> None:
    """Refuse valid values that this cluster's settings cannot honour.

    Raises:
        TopicError: ``invalid_config`` naming the setting that sets the limit.
    """
    limit = storage.max_topic_batch_bytes
    if int(configs.get(MAX_MESSAGE_BYTES_CONFIG, 0)) > limit:
        raise TopicError(
            ErrorCode.invalid_config,
            f"{MAX_MESSAGE_BYTES_CONFIG} {configs[MAX_MESSAGE_BYTES_CONFIG]} is over this "
            f"cluster's limit of {limit} bytes ([storage] max_topic_batch_bytes)",
        )


def stored_compression(configs: Mapping[str, str]) -> Compression | None:
    """The codec a topic's batches are stored with, or ``None``: the producer's."""
    return _CODECS.get(configs.get(COMPRESSION_CONFIG, "producer"))


def batch_limit(configs: Mapping[str, str], storage: StorageOptions) -> int:
    """The largest batch a producer may send to a topic with ``configs``."""
    own = configs.get(MAX_MESSAGE_BYTES_CONFIG)
    if own is None:
        return storage.max_batch_bytes
    return min(int(own), storage.max_topic_batch_bytes)  # stored before the limit was lowered


def effective_value(configs: Mapping[str, str], name: str, storage: StorageOptions) -> str:
    """The value in effect for ``name``: the topic's own, else the default."""
    if name in configs:
        return configs[name]
    return config_key(name).default_value(storage)


def alter_incrementally(
    configs: Mapping[str, str],
    changes: Sequence[tuple[str, AlterOp, str | None]],
    storage: StorageOptions,
) -> dict[str, str]:
    """The topic's configs after IncrementalAlterConfigs ``(name, op, value)`` changes.

    APPEND and SUBTRACT apply to list configs only and start from the value in effect (the
    default when the topic has none), as Kafka does; APPEND skips items already present.

    Raises:
        TopicError: ``invalid_config`` for an unknown key, a bad value, or APPEND/SUBTRACT on
            a config that is not a list.
    """
    result = dict(configs)
    for name, op, value in changes:
        key = config_key(name)
        if op is AlterOp.DELETE:
            result.pop(name, None)
            continue
        if op is AlterOp.SET:
            result[name] = validate_value(name, value)
            continue
        if key.type is not ConfigType.LIST:
            verb = "append" if op is AlterOp.APPEND else "subtract"
            raise TopicError(
                ErrorCode.invalid_config,
                f"Config value {verb} is not allowed for config key: {name}",
            )
        current = split_list(effective_value(result, name, storage))
        given = split_list(validate_value(name, value))
        items = (
            current + [v for v in given if v not in current]
            if op is AlterOp.APPEND
            else [v for v in current if v not in given]
        )
        result[name] = ",".join(items)
    check_limits(result, storage)
    return result


def describe(configs: Mapping[str, str], storage: StorageOptions) -> list[ConfigEntry]:
    """Every known topic config with its value in effect, source and synonyms, by name."""
    return [_entry(key, configs.get(key.name), storage) for key in TOPIC_CONFIGS.values()]


def _entry(key: ConfigKey, own: str | None, storage: StorageOptions) -> ConfigEntry:
    synonyms = []
    if own is not None:
        synonyms.append(Synonym(key.name, own, ConfigSource.DYNAMIC_TOPIC_CONFIG))
    broker = key.broker_default
    if broker is not None and broker.source(storage) is ConfigSource.STATIC_BROKER_CONFIG:
        synonyms.append(
            Synonym(broker.kafka_name, broker.value(storage), ConfigSource.STATIC_BROKER_CONFIG)
        )
    default_name = broker.kafka_name if broker is not None else key.name
    synonyms.append(Synonym(default_name, key.default, ConfigSource.DEFAULT_CONFIG))
    return ConfigEntry(
        key.name,
        synonyms[0].value,
        synonyms[0].source,
        key.type,
        key.documentation,
        tuple(synonyms),
    )
