"""The row schema of every topic table, shared by the Parquet writer and every table format.

One row per Kafka record. The batch columns keep what is needed to rebuild the original record
batches for Kafka consumers (same base offsets, same attributes), so a consumer cannot tell a
compacted range from one still in the WAL.

Constraints from sharing one Parquet file between Iceberg and Delta (docs/tables.md): no field
ids (Iceberg reads through a name mapping), required columns declared non-null, timestamps as
``timestamp(us, UTC)``, no 8- or 16-bit integers (Iceberg has none), and the partition column
kept inside the file with statistics (Iceberg derives the partition value from it).
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

PARTITION: Final = "partition"
OFFSET: Final = "offset"
TIMESTAMP: Final = "timestamp"

HEADER_TYPE: Final = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
)

ROW_SCHEMA: Final = pa.schema(
    [
        pa.field(PARTITION, pa.int32(), nullable=False),
        pa.field(OFFSET, pa.int64(), nullable=False),
        pa.field(TIMESTAMP, pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("timestamp_type", pa.int32(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers", pa.list_(pa.field("element", HEADER_TYPE, nullable=False)), nullable=False
        ),
        pa.field("batch_base_offset", pa.int64(), nullable=False),
        pa.field("batch_attributes", pa.int32(), nullable=False),
        pa.field("producer_id", pa.int64(), nullable=False),
        pa.field("producer_epoch", pa.int32(), nullable=False),
        pa.field("base_sequence", pa.int32(), nullable=False),
    ]
)
"""Arrow schema of a topic table's rows (and of its Parquet data files)."""
