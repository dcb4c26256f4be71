"""Fixtures of the compaction tests: storage, topics and a compactor on the embedded default."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from icefloe.compaction.service import Compactor
from icefloe.config import Config
from icefloe.storage.engine import StreamStorage
from icefloe.topics.registry import TopicRegistry
from tests.support.storage import storage_config


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return storage_config(tmp_path, commit_deadline_s=0.2, orphan_grace_s=0.5)


@pytest.fixture
async def parts(config: Config) -> AsyncIterator[tuple[StreamStorage, TopicRegistry, Compactor]]:
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            yield storage, topics, compactor
        finally:
            await compactor.close()
            await topics.close()
