"""The Spark engine on a real Spark standalone cluster (a master and two one-core workers on
127.0.0.1, :mod:`tests.support.spark_cluster`): the CompactionEngine contract, invariants 4-6,
and the failures a cluster brings (an executor killed mid-task, a slow task with speculation
on), with each table holding every record exactly once afterwards.

One SparkContext (this process is the driver) serves the whole module; speculation is on for
all of it, so every test here also runs with speculative copies allowed.
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from icefloe_compaction_spark.engine import SparkCompactionEngine
from icefloe_compaction_spark.options import SparkCompactionOptions
from icefloe_table_delta.stats import TAIL_BYTES

from icefloe.compaction.service import Compactor
from icefloe.config import Config, load_config
from icefloe.ports.base import OpenContext
from icefloe.ports.object_store import RequestKind, RequestStats
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.tables import layout
from icefloe.testing.compaction_contract import CompactionEngineContract
from icefloe.topics.registry import TopicRegistry
from tests.compaction.test_saga_crashes import records, table_rows
from tests.support.spark_cluster import (
    SLOW_S,
    SparkCluster,
    compact_as_slow_driver,
    install_slow_tasks,
    spark_cluster,
)
from tests.support.storage import count_wal_reads

SPAWN = multiprocessing.get_context("spawn")
SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "200ms",
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "2",
    "spark.speculation.minTaskRuntime": "3s",
    # Judge a slow task by its time alone: a task's Python work reports no input metrics.
    "spark.speculation.efficiency.enabled": "false",
}


@pytest.fixture(scope="module")
def cluster() -> SparkCluster:
    return spark_cluster()


@pytest.fixture(scope="module", autouse=True)
def shared_context(
    cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SparkCompactionEngine]:
    """Start the module's SparkContext on the cluster; engines opened in tests borrow it."""
    context = OpenContext(data_dir=tmp_path_factory.mktemp("spark"), config=load_config(env={}))
    options = SparkCompactionOptions.model_validate(cluster.engine_options(**SPECULATION))
    engine = asyncio.run(SparkCompactionEngine.open(options, context))
    asyncio.run(engine.start())
    cluster.wait_for_executors(2)
    try:
        yield engine
    finally:
        asyncio.run(engine.close())


class TestSparkClusterCompactionEngine(CompactionEngineContract):
    backend_name = "spark"

    def backend_options(self, workdir: Path, unique: str) -> dict[str, Any]:
        return spark_cluster().engine_options(**SPECULATION)


# --- compaction through the saga on the cluster ---------------------------------------------


def cluster_config(tmp_path: Path, cluster: SparkCluster) -> Config:
    return load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "storage": {"flush_interval_ms": 2},
            "table": {"formats": ["iceberg", "delta"]},
            # Two tasks per run: one per executor.
            "compactor": {"max_task_bytes": 6000, "max_tasks_per_run": 2},
            "compaction": {"backend": "spark", "spark": cluster.engine_options(**SPECULATION)},
        },
    )


@pytest.fixture
async def parts(
    tmp_path: Path, cluster: SparkCluster
) -> AsyncIterator[tuple[Config, StreamStorage, TopicRegistry, Compactor]]:
    config = cluster_config(tmp_path, cluster)
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            yield config, storage, topics, compactor
        finally:
            await compactor.close()
            await topics.close()


async def fill(storage: StreamStorage, topics: TopicRegistry) -> dict[int, list[Any]]:
    """Three partitions of 200 records, each round of appends one WAL object of ~1.5 KB."""
    topic = await topics.create("events", 3)
    for round_ in range(8):
        await asyncio.gather(
            *(
                storage.append(s, records(25, f"r{round_}-{s}", 1, 25 * round_))
                for s in topic.streams
            )
        )
    return {s: await read(storage, s) for s in topic.streams}


async def read(storage: StreamStorage, stream: int) -> list[Any]:
    return [
        (r.offset, r.timestamp, r.key, r.value, r.headers)
        for r in await storage.read_records(stream, 0, 1 << 24)
    ]


async def check_exactly_once(
    compactor: Compactor, storage: StreamStorage, expected: dict[int, list[Any]]
) -> None:
    """Invariants 4 and 5: consumers read what they read before; each table holds every
    record once; and no data file is left beside the ones the tables reference."""
    for stream, rows in expected.items():
        entries = await storage.index.scan(stream)
        assert all(isinstance(e.location, ParquetLocation) for e in entries)
        assert await read(storage, stream) == rows
    wanted = sorted(
        (partition, row[0], row[3])
        for partition, rows in enumerate(expected.values())
        for row in rows
    )
    for name, rows in (await table_rows(compactor, "events")).items():
        assert rows == wanted, f"{name}: not every record exactly once"
    root = layout.table_root("events") + "/"
    stored = {
        i.key.removeprefix(root)
        async for i in storage.object_store.list(root)
        if i.key.endswith(".parquet") and "/partition=" in "/" + i.key.removeprefix(root)
    }
    spec = compactor.committer.table_spec("events")
    for table_format in compactor.table_formats.values():
        assert {f.path for f in await table_format.files(spec)} == stored


async def test_compaction_on_the_cluster_spreads_tasks_and_keeps_records_once(
    parts: tuple[Config, StreamStorage, TopicRegistry, Compactor], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, storage, topics, compactor = parts
    expected = await fill(storage, topics)
    store = storage.object_store
    touched: list[tuple[str, str, int | None]] = []
    for name in ("get", "put"):
        method = getattr(store, name)
        monkeypatch.setattr(store, name, functools.partial(recorded, name, method, touched))
    read_by_the_driver = count_wal_reads(storage.wal)
    tasks = await compactor.until_idle()
    assert tasks >= 2
    assert compactor.engine.tasks_finished() == tasks
    # The executors read the WAL and wrote the data files; the driver wrote the tables'
    # metadata and read data files' footers (Delta's statistics), so no record went through it.
    files = {e.location.key for s in expected for e in await storage.index.scan(s)}  # type: ignore[union-attr]
    data_bytes = sum([i.size async for i in store.list("") if i.key in files])
    assert moved(compactor.engine.stats) >= data_bytes > 0
    assert read_by_the_driver == []
    assert touched
    data = [(name, size) for name, key, size in touched if key.endswith(".parquet")]
    assert all(name == "get" and size is not None and size <= TAIL_BYTES for name, size in data)
    await check_exactly_once(compactor, storage, expected)
    # Invariant 6: collecting garbage now deletes nothing the index or a table references.
    await compactor.collect_garbage()
    await storage.collect_orphans()
    await check_exactly_once(compactor, storage, expected)


async def recorded(
    name: str, method: Any, touched: list[tuple[str, str, int | None]], key: str, *args: Any
) -> Any:
    """Call a store's ``get`` or ``put``, noting the key and (for a ranged get) the range's
    length."""
    size = args[1] - args[0] if name == "get" and len(args) == 2 and args[1] is not None else None
    touched.append((name, key, size))
    return await method(key, *args)


def moved(stats: RequestStats) -> int:
    """Bytes read and written (GET and PUT) through a store."""
    return stats.bytes[RequestKind.GET] + stats.bytes[RequestKind.PUT]


# --- failures -------------------------------------------------------------------------------


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    """Where slowed tasks leave their marks (:func:`slowed`)."""
    folder = tmp_path / "marks"
    folder.mkdir()
    return folder


@pytest.fixture
def slowed_tasks(marks: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """This driver's jobs run :func:`slowed` (its first task written first, when the test
    is parametrized so); yields the folder of its marks."""
    undo = install_slow_tasks(marks, write_first=getattr(request, "param", False))
    yield marks
    undo()


def executor_of(pid: int, executors: list[int]) -> int:
    """The executor JVM a Python worker ``pid`` runs under (its parent's parent, or so)."""
    while pid > 1 and pid not in executors:
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rpartition(")")[2].split()[1])
    assert pid in executors, "the slow task's Python worker is under no executor"
    return pid


async def wait_for(path: Path) -> str:
    """The content of ``path`` once it has some (within a minute)."""
    deadline = time.monotonic() + 60.0
    while not (text := await asyncio.to_thread(read_or_empty, path)):
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        await asyncio.sleep(0.1)
    return text


def read_or_empty(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def attempts(marks: Path) -> list[Path]:
    return list(marks.glob("attempt-*"))


@pytest.mark.parametrize("slowed_tasks", [True], indirect=True)
async def test_an_executor_killed_mid_task_is_retried_and_no_file_is_registered_twice(
    parts: tuple[Config, StreamStorage, TopicRegistry, Compactor],
    cluster: SparkCluster,
    slowed_tasks: Path,
) -> None:
    _, storage, topics, compactor = parts
    expected = await fill(storage, topics)
    before = compactor.engine.tasks_finished()
    running = asyncio.create_task(compactor.until_idle())
    worker_pid = int(await wait_for(slowed_tasks / "slow"))
    # The run's other task finishes while this one waits: progress counts it mid-run.
    deadline = time.monotonic() + 60
    while compactor.engine.tasks_finished() == before:
        assert time.monotonic() < deadline, "no task counted finished while the job ran"
        await asyncio.sleep(0.1)
    assert not running.done()
    victim = executor_of(worker_pid, cluster.executor_pids())
    os.kill(victim, signal.SIGKILL)
    tasks = await asyncio.wait_for(running, 120)
    assert tasks >= 2
    assert victim not in cluster.executor_pids()
    assert attempts(slowed_tasks), "the killed task was not run again"
    await check_exactly_once(compactor, storage, expected)
    cluster.wait_for_executors(2)  # the master replaces the lost executor for the next tests


async def test_a_slow_task_is_outrun_by_its_speculative_copy_without_duplicate_output(
    parts: tuple[Config, StreamStorage, TopicRegistry, Compactor], slowed_tasks: Path
) -> None:
    _, storage, topics, compactor = parts
    expected = await fill(storage, topics)
    started = time.monotonic()
    tasks = await compactor.until_idle()
    assert time.monotonic() - started < SLOW_S, "the job waited for the slow attempt"
    assert tasks >= 2
    assert attempts(slowed_tasks), "no speculative copy ran"
    await check_exactly_once(compactor, storage, expected)


async def test_a_driver_killed_mid_run_leaves_a_run_that_icefloe_compact_finishes(
    parts: tuple[Config, StreamStorage, TopicRegistry, Compactor],
    cluster: SparkCluster,
    marks: Path,
) -> None:
    config, storage, topics, compactor = parts
    expected = await fill(storage, topics)
    driver = SPAWN.Process(target=compact_as_slow_driver, args=(config, marks))
    driver.start()
    try:
        await wait_for(marks / "slow")  # a task wrote its files; the run is not committed
    finally:
        driver.kill()
        await asyncio.to_thread(driver.join, 30)
    assert driver.exitcode == -signal.SIGKILL
    [left] = await compactor.committer.unfinished()
    assert left.state == "planned"
    assert len(left.tasks) == 2

    # The next compactor: `icefloe compact` on the cluster, its process the driver.
    options = cluster.engine_options()
    conf = [f"--spark-conf={k}={v}" for k, v in options["conf"].items()]
    env = {
        **os.environ,
        "ICEFLOE_COMPACTION__SPARK__PYTHON": sys.executable,
        "ICEFLOE_COMPACTOR__MAX_TASK_BYTES": "6000",
        "ICEFLOE_COMPACTOR__MAX_TASKS_PER_RUN": "2",
    }
    icefloe = Path(sys.executable).parent / "icefloe"
    done = await asyncio.to_thread(
        subprocess.run,
        [
            *(str(icefloe), "compact", "--until-idle", "--data-dir", str(config.data_dir)),
            *("--engine", "spark", "--master", cluster.master_url, *conf),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "compacting"
    # Without a terminal, a line per run: the resumed one first.
    assert re.fullmatch(r"compacted \d+ records of 3 streams in 2 tasks: .*", lines[1]), lines
    assert re.fullmatch(r"compacted 600 records in \d+ tasks: .*", lines[-1]), lines
    assert await compactor.committer.unfinished() == []
    await check_exactly_once(compactor, storage, expected)
