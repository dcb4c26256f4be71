"""The one authoritative table of the Kafka APIs Icefloe serves, with their version ranges.

ApiVersions advertises exactly this table, the server refuses versions outside it, and a test
checks that kio can decode every request version and encode every response version listed.
Minimum versions are Apache Kafka 4.0's (KIP-896 removed the older ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from kio.schema.index import api_key_map


@dataclass(frozen=True, slots=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handler: str
    """``"module:function"`` under ``icefloe.broker.handlers``, imported on first use."""

    @property
    def name(self) -> str:
        return api_key_map[self.key]

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


def _api(key: int, min_version: int, max_version: int, handler: str) -> Api:
    return Api(key, min_version, max_version, f"icefloe.broker.handlers.{handler}")


SUPPORTED_APIS: Final[dict[int, Api]] = {
    api.key: api
    for api in (
        _api(0, 3, 11, "produce:handle_produce"),
        _api(1, 4, 12, "fetch:handle_fetch"),
        _api(2, 1, 8, "list_offsets:handle_list_offsets"),
        _api(3, 0, 12, "metadata:handle_metadata"),
        _api(8, 2, 10, "offsets:handle_offset_commit"),
        _api(9, 1, 10, "offsets:handle_offset_fetch"),
        _api(10, 0, 6, "groups:handle_find_coordinator"),
        _api(11, 0, 9, "groups:handle_join_group"),
        _api(12, 0, 4, "groups:handle_heartbeat"),
        _api(13, 0, 5, "groups:handle_leave_group"),
        _api(14, 0, 5, "groups:handle_sync_group"),
        _api(15, 0, 6, "groups:handle_describe_groups"),
        _api(16, 0, 5, "groups:handle_list_groups"),
        _api(17, 1, 1, "sasl:handle_sasl_handshake"),
        _api(18, 0, 4, "api_versions:handle_api_versions"),
        _api(19, 2, 7, "topics:handle_create_topics"),
        _api(20, 1, 6, "topics:handle_delete_topics"),
        _api(21, 0, 2, "partition_admin:handle_delete_records"),
        _api(22, 0, 5, "init_producer_id:handle_init_producer_id"),
        _api(23, 2, 4, "list_offsets:handle_offset_for_leader_epoch"),
        _api(24, 0, 3, "transactions:handle_add_partitions_to_txn"),
        _api(25, 0, 4, "transactions:handle_add_offsets_to_txn"),
        _api(26, 0, 4, "transactions:handle_end_txn"),
        _api(28, 0, 4, "transactions:handle_txn_offset_commit"),
        _api(29, 1, 3, "acls:handle_describe_acls"),
        _api(30, 2, 3, "acls:handle_create_acls"),
        _api(31, 2, 3, "acls:handle_delete_acls"),
        _api(32, 1, 4, "configs:handle_describe_configs"),
        _api(33, 0, 2, "configs:handle_alter_configs"),
        _api(35, 1, 4, "partition_admin:handle_describe_log_dirs"),
        _api(36, 0, 2, "sasl:handle_sasl_authenticate"),
        _api(37, 0, 3, "topics:handle_create_partitions"),
        _api(42, 0, 2, "groups:handle_delete_groups"),
        _api(44, 0, 1, "configs:handle_incremental_alter_configs"),
        _api(47, 0, 0, "offsets:handle_offset_delete"),
        _api(48, 0, 1, "client_quotas:handle_describe_client_quotas"),
        _api(49, 0, 1, "client_quotas:handle_alter_client_quotas"),
        _api(50, 0, 0, "scram_credentials:handle_describe_user_scram_credentials"),
        _api(51, 0, 0, "scram_credentials:handle_alter_user_scram_credentials"),
        _api(60, 0, 1, "cluster:handle_describe_cluster"),
        _api(61, 0, 0, "partition_admin:handle_describe_producers"),
        _api(65, 0, 0, "transactions:handle_describe_transactions"),
        _api(66, 0, 1, "transactions:handle_list_transactions"),
        _api(68, 0, 1, "consumer_group:handle_consumer_group_heartbeat"),
        _api(69, 0, 1, "consumer_group:handle_consumer_group_describe"),
    )
}
