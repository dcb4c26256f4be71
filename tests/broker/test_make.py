"""``make`` builds a kio entity of any version from the values every version needs, and
refuses a value that names a field of no version (a misspelling would otherwise vanish)."""

from __future__ import annotations

import datetime

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import response as fetch_v4
from kio.schema.fetch.v12 import response as fetch_v12
from kio.schema.metadata.v12 import response as metadata_v12

from icefloe.broker.protocol import make

ANSWER = {
    "partition_index": 0,
    "error_code": ErrorCode.none,
    "high_watermark": 1,
    "last_stable_offset": 1,
    "log_start_offset": 0,
    "aborted_transactions": None,
    "preferred_read_replica": -1,  # a field of v11 and later
    "records": b"",
}


def test_values_of_fields_other_versions_have_are_left_out() -> None:
    old = make(fetch_v4.PartitionData, **ANSWER)
    new = make(fetch_v12.PartitionData, **ANSWER)

    assert not hasattr(old, "preferred_read_replica")
    assert new.preferred_read_replica == -1


def test_a_name_no_version_has_is_refused() -> None:
    with pytest.raises(TypeError, match=r"PartitionData has no field \['partiton_index'\]"):
        make(fetch_v12.PartitionData, **{**ANSWER, "partiton_index": 0})


def test_a_field_only_middle_versions_have_is_left_out_too() -> None:
    # cluster_authorized_operations is a field of Metadata v8 to v10 only: neither the oldest
    # nor the newest version tells that it is no misspelling.
    answer = make(
        metadata_v12.MetadataResponse,
        throttle_time=datetime.timedelta(0),
        brokers=(),
        cluster_id=None,
        controller_id=-1,
        topics=(),
        cluster_authorized_operations=-2147483648,
    )

    assert not hasattr(answer, "cluster_authorized_operations")
