"""The metadata keyspace: every key prefix Icefloe keeps in the metadata store, the one module
that writes under it, and what its values hold.

Each prefix has one owner. Only the owner writes keys under its prefix; other modules read
them through the owner's API, or read the keys themselves where a reader is listed. A test
(``tests/unit/test_keyspace.py``) checks that no other core module uses a prefix, and
``docs/design.md`` shows this table.

Prefixes are top-level (no prefix is inside another), so that a scan of one never walks
through another, and adapters that shard by parent path keep a stream's keys together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

STREAMS: Final = "streams/"
STREAM_NAMES: Final = "stream-names/"
COUNTERS: Final = "counters/"
TOPICS: Final = "topics/"
DELETED_TOPICS: Final = "deleted-topics/"
BROKERS: Final = "brokers/"
CLUSTER: Final = "cluster/"
GROUPS: Final = "groups/"
GROUP_LEASES: Final = "group-leases/"
GROUP_ALIVE: Final = "group-alive/"
GROUP_OFFSETS: Final = "group-offsets/"
COMPACTION: Final = "compaction/"
USERS: Final = "users/"
ACLS: Final = "acls/"
TRANSACTIONS: Final = "transactions/"
TXN_OPEN: Final = "txn-open/"
TXN_PENDING_OFFSETS: Final = "txn-pending-offsets/"
QUOTAS: Final = "quotas/"
SCHEMA_REGISTRY: Final = "schema-registry/"


@dataclass(frozen=True, slots=True)
class Prefix:
    """One family of keys."""

    name: str
    """The name of the constant in this module."""
    prefix: str
    layout: str
    """The keys under it, with their variable parts in angle brackets."""
    owner: str
    """The only module that writes under the prefix."""
    value: str
    """What a value holds."""
    readers: tuple[str, ...] = ()
    """Modules besides the owner that read these keys directly."""


KEYSPACE: Final = (
    Prefix(
        "STREAMS",
        STREAMS,
        "streams/<stream id, 12 digits>/stream",
        "icefloe.storage.engine",
        "msgpack {name, created_ms}: the stream's own record",
        readers=("icefloe.storage.keys",),
    ),
    Prefix(
        "STREAMS",
        STREAMS,
        "streams/<stream id>/index-<end offset, 20 digits>-<cumulative bytes, 20 digits>",
        "icefloe.storage.offset_index",
        "msgpack index entry: a WAL chunk or a Parquet file holding offsets [end - n, end), "
        "its batches and idempotent-producer batches (icefloe.storage.index)",
        readers=("icefloe.storage.keys", "icefloe.storage.index_reader", "icefloe.storage.orphans"),
    ),
    Prefix(
        "STREAMS",
        STREAMS,
        "streams/<stream id>/log-start",
        "icefloe.storage.offset_index",
        "the log start DeleteRecords set, in decimal; it only moves forward (absent: 0)",
        readers=("icefloe.storage.keys", "icefloe.storage.index_reader"),
    ),
    Prefix(
        "STREAMS",
        STREAMS,
        "streams/<stream id>/producers/<producer id>",
        "icefloe.storage.producers",
        "msgpack lease of an idempotent producer on the stream, with its last batches",
        readers=("icefloe.storage.keys",),
    ),
    Prefix(
        "STREAMS",
        STREAMS,
        "streams/<stream id>/txn-aborted/<marker offset, 20 digits>",
        "icefloe.storage.transactions",
        "msgpack [producer id, first offset bound]: an aborted transaction's records in the stream",
    ),
    Prefix(
        "STREAM_NAMES",
        STREAM_NAMES,
        "stream-names/<stream name>",
        "icefloe.storage.engine",
        "the stream id, in decimal",
        readers=("icefloe.storage.keys",),
    ),
    Prefix(
        "COUNTERS",
        COUNTERS,
        "counters/<name: stream-id, producer-id, node-id, table-sequence/<topic>, schema-id>",
        "icefloe.storage.counters",
        "the counter's value, in decimal, advanced by compare-and-set",
        readers=("icefloe.storage.keys",),
    ),
    Prefix(
        "TOPICS",
        TOPICS,
        "topics/<topic name>",
        "icefloe.topics.registry",
        "msgpack {id, streams, configs, created_ms}: a topic and its partitions' streams",
    ),
    Prefix(
        "DELETED_TOPICS",
        DELETED_TOPICS,
        "deleted-topics/<topic id, 32 hex digits>",
        "icefloe.topics.registry",
        "msgpack [name, topic record]: a deleted topic whose tables the compaction leader has "
        "not dropped yet",
    ),
    Prefix(
        "BROKERS",
        BROKERS,
        "brokers/<node id>",
        "icefloe.cluster",
        "msgpack [node id, host, port, zone, metrics port, {listener: [host, port]}]; "
        "ephemeral: gone when the broker's session ends",
    ),
    Prefix(
        "CLUSTER",
        CLUSTER,
        "cluster/id",
        "icefloe.cluster",
        "the cluster id (Kafka's, 22 characters), set once by the first broker",
    ),
    Prefix(
        "CLUSTER",
        CLUSTER,
        "cluster/node-ids/<host>:<port>",
        "icefloe.cluster",
        "the node id, in decimal, of the broker at that address (when not configured): a "
        "restarted broker takes it again",
    ),
    Prefix(
        "GROUPS",
        GROUPS,
        "groups/<group id, percent-encoded>",
        "icefloe.groups.store",
        "msgpack group record: classic or KIP-848 state, members, assignment",
        readers=("icefloe.groups.keys",),
    ),
    Prefix(
        "GROUP_LEASES",
        GROUP_LEASES,
        "group-leases/<group id>",
        "icefloe.groups.coordinator",
        "the node id of the broker running the group's timers; ephemeral",
        readers=("icefloe.groups.keys",),
    ),
    Prefix(
        "GROUP_ALIVE",
        GROUP_ALIVE,
        "group-alive/<group id>/<member id, percent-encoded>",
        "icefloe.groups.store",
        "the time a member was last heard from, in milliseconds",
        readers=("icefloe.groups.keys",),
    ),
    Prefix(
        "GROUP_OFFSETS",
        GROUP_OFFSETS,
        "group-offsets/<group id>/<topic, percent-encoded>/<partition, 10 digits>",
        "icefloe.groups.store",
        "msgpack committed offset, leader epoch, metadata and commit time",
        readers=("icefloe.groups.keys",),
    ),
    Prefix(
        "COMPACTION",
        COMPACTION,
        "compaction/leader",
        "icefloe.compaction.service",
        "the node id of the compaction leader; ephemeral",
    ),
    Prefix(
        "COMPACTION",
        COMPACTION,
        "compaction/tasks/<created ms, 15 digits>-<task id>",
        "icefloe.compaction.committer",
        "msgpack saga record of one compaction, rewrite or expiry task (planned, written, "
        "committed)",
    ),
    Prefix(
        "COMPACTION",
        COMPACTION,
        "compaction/retired/<created ms, 15 digits>-<task id>",
        "icefloe.compaction.committer",
        "msgpack [delete after ms, object keys]: data files a task took out of the tables and "
        "the index, deleted once the grace period is over",
    ),
    Prefix(
        "COMPACTION",
        COMPACTION,
        "compaction/cleaned/<stream id, 12 digits>",
        "icefloe.compaction.committer",
        "msgpack [cleaned end offset, earliest tombstone expiry ms or nil]: how far log "
        "compaction (cleanup.policy=compact) has cleaned a stream",
    ),
    Prefix(
        "USERS",
        USERS,
        "users/<user name, percent-encoded>/<SCRAM mechanism>",
        "icefloe.security.users",
        "msgpack [salt, stored key, server key, iterations]: a SASL user's salted credential "
        "(never the password)",
    ),
    Prefix(
        "ACLS",
        ACLS,
        "acls/<resource type>/<literal or prefixed>/<resource name, percent-encoded>",
        "icefloe.security.acl_store",
        "msgpack [[principal, host, operation code, permission code], ...]: every ACL on one "
        "resource pattern",
    ),
    Prefix(
        "TRANSACTIONS",
        TRANSACTIONS,
        "transactions/<transactional id, percent-encoded>",
        "icefloe.transactions.coordinator",
        "msgpack transaction state: producer id and epoch, state, partitions, groups, pending "
        "offsets",
    ),
    Prefix(
        "TXN_OPEN",
        TXN_OPEN,
        "txn-open/<stream id>/<producer id, 20 digits>",
        "icefloe.storage.transactions",
        "msgpack [epoch, first offset bound, transactional id]: a transaction that may write to "
        "the stream (the last stable offset is the least bound)",
    ),
    Prefix(
        "TXN_PENDING_OFFSETS",
        TXN_PENDING_OFFSETS,
        "txn-pending-offsets/<group id, percent-encoded>/<transactional id, percent-encoded>",
        "icefloe.transactions.pending",
        "msgpack [producer id, epoch, transaction start ms, {topic: [partitions]}]: partitions "
        "whose offsets an open transaction may commit to the group (OffsetFetch with "
        "require_stable answers UNSTABLE_OFFSET_COMMIT for them)",
    ),
    Prefix(
        "QUOTAS",
        QUOTAS,
        "quotas/user/<user>/client-id/<client id>",
        "icefloe.security.quotas",
        "msgpack {quota key: value}: one client-quota entity's producer_byte_rate, "
        "consumer_byte_rate, request_percentage and controller_mutation_rate; the key has "
        "either part alone too, each name percent-encoded or <default>",
    ),
    Prefix(
        "SCHEMA_REGISTRY",
        SCHEMA_REGISTRY,
        "schema-registry/ids/<schema id, 10 digits>",
        "icefloe.schemas.store",
        "msgpack [schema type, schema text, [[name, subject, version], ...]]: a registered "
        "schema; never changed once written",
    ),
    Prefix(
        "SCHEMA_REGISTRY",
        SCHEMA_REGISTRY,
        "schema-registry/fingerprints/<SHA-256 of type, canonical text and references>",
        "icefloe.schemas.store",
        "the schema id, in decimal: one id per distinct schema, claimed by compare-and-set",
    ),
    Prefix(
        "SCHEMA_REGISTRY",
        SCHEMA_REGISTRY,
        "schema-registry/subjects/<subject, percent-encoded>/<version, 10 digits>",
        "icefloe.schemas.store",
        "msgpack [schema id, soft-deleted]: one version of a subject",
    ),
    Prefix(
        "SCHEMA_REGISTRY",
        SCHEMA_REGISTRY,
        "schema-registry/referenced/<subject, percent-encoded>/<version, 10 digits>/<schema id>",
        "icefloe.schemas.store",
        "empty: the schema id references that subject version",
    ),
    Prefix(
        "SCHEMA_REGISTRY",
        SCHEMA_REGISTRY,
        "schema-registry/<config or mode>/<subject, percent-encoded>",
        "icefloe.schemas.store",
        "a subject's compatibility level (NONE, BACKWARD, …) or mode (READWRITE, READONLY, IMPORT)",
    ),
    Prefix(
        "SCHEMA_REGISTRY",
        SCHEMA_REGISTRY,
        "schema-registry/<global-config or global-mode>",
        "icefloe.schemas.store",
        "the compatibility level or mode of subjects that have none of their own",
    ),
)
"""Every key family, in the order ``docs/design.md`` shows them."""


def prefix_end(prefix: str) -> str:
    """The least key after every key that starts with ``prefix``: ``[prefix,
    prefix_end(prefix))`` scans exactly the keys under it."""
    if not prefix:
        raise ValueError("the empty prefix has no end")
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)
