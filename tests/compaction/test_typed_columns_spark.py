"""A schema-backed topic compacted by the Spark engine (local mode): the executors open the
registry's store from the configuration the task carries and write the same typed columns as
the in-process engine; Kafka reads stay byte-identical."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
from icefloe_compaction_spark.engine import SparkCompactionEngine

from icefloe.compaction.service import Compactor
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record
from icefloe.topics.configs import VALUE_SCHEMA_CONFIG
from icefloe.topics.registry import TopicRegistry
from tests.compaction.test_spark_engine import spark_config
from tests.compaction.test_typed_columns import V1, encoded, order, register, values


async def test_spark_executors_decode_typed_columns(
    shared_spark: SparkCompactionEngine, tmp_path: Path
) -> None:
    config = spark_config(tmp_path)
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            topic = await topics.create("orders", 1, {VALUE_SCHEMA_CONFIG: "registry"})
            v1 = await register(storage, V1)
            good = [encoded(v1, V1, order(i)) for i in range(4)]
            await storage.append(
                topic.streams[0], [Record(0, 1000, None, v) for v in [*good, b"x"]]
            )
            before = await values(storage, topic)
            assert await compactor.until_idle() == 1
            assert await values(storage, topic) == before
            [entry] = await storage.index.scan(topic.streams[0])
            assert isinstance(entry.location, ParquetLocation)
            data = await storage.object_store.get(entry.location.key)
            rows = pq.read_table(io.BytesIO(data)).to_pylist()
            assert [r["value_fields"]["id"] for r in rows[:4]] == [0, 1, 2, 3]
            assert rows[4]["value_fields"] is None
            assert rows[4]["value_error"].startswith("not in the wire format")
        finally:
            await compactor.close()
            await topics.close()
