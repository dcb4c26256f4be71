"""Topics become tables under the cluster's identifier template or their own alias, with both
formats and the files where the topic's name puts them."""

from __future__ import annotations

from pathlib import Path

import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import load_config
from icefloe.storage.engine import StreamStorage
from icefloe.storage.records import Record
from icefloe.tables import layout
from icefloe.topics.registry import TopicError, TopicRegistry


async def test_tables_take_the_template_or_the_topics_alias(tmp_path: Path) -> None:
    config = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"], "identifier": "lake.kafka_{topic}"},
        },
    )
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage, config.table.identifier)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            plain = await topics.create("shop.clicks", 1)
            aliased = await topics.create(
                "orders.v2", 1, {"icefloe.table.identifier": "sales.orders"}
            )
            for topic in (plain, aliased):
                await storage.append(topic.streams[0], [Record(0, 0, None, b"v")] * 3)
            await compactor.until_idle()

            for topic, identifier in ((plain, "lake.kafka_shop_clicks"), (aliased, "sales.orders")):
                spec = compactor.committer.table_spec(topic.name)
                assert spec.identifier == identifier
                assert spec.location.endswith("/" + layout.table_root(topic.name))
                for name, table_format in compactor.table_formats.items():
                    info = await table_format.ensure_table(spec)
                    files = await table_format.files(spec)
                    assert sum(f.record_count for f in files) == 3, name
                    if name == "iceberg":
                        assert info.identifier == identifier
        finally:
            await compactor.close()
            await topics.close()


async def test_two_topics_may_not_share_a_table(tmp_path: Path) -> None:
    config = load_config(env={}, overrides={"data_dir": str(tmp_path)})
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        try:
            await topics.create("a.b", 1)
            with pytest.raises(TopicError, match=r"would share the table icefloe\.a_b"):
                await topics.create("a_b", 1)
            await topics.create("c", 1, {"icefloe.table.identifier": "x.y"})
            await topics.create("d", 1)
            with pytest.raises(TopicError, match="with topic 'c'"):
                await topics.set_configs("d", {"icefloe.table.identifier": "x.y"})
            await topics.set_configs("c", {"icefloe.table.identifier": "x.y2"})  # its own: fine
        finally:
            await topics.close()
