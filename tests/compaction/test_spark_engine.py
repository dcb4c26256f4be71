"""The Spark compaction engine in Spark local mode: the same tables as the in-process engine.

Spark starts once for the module (a JVM takes seconds to start); engines opened by the tests
borrow that context. Without Java or PySpark these tests fail rather than skip: the Spark run is
part of the suite.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from icefloe_compaction_spark.engine import SparkCompactionEngine
from icefloe_compaction_spark.options import SparkCompactionOptions
from icefloe_compaction_spark.testing import QUICK_LOCAL_OPTIONS
from pydantic import ValidationError

from icefloe import config as configuration
from icefloe.compaction.service import Compactor
from icefloe.compaction.task import WorkerResult
from icefloe.config import Config, load_config
from icefloe.errors import CorruptDataError, UnavailableError
from icefloe.ports.base import PortKind
from icefloe.ports.compaction import CompactionEngine, CompactionTask, WrittenFile
from icefloe.storage.batch import Compression
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.records import Record, build_batch
from icefloe.testing.compaction_contract import make_records, task_for, write_streams
from icefloe.testing.contract import open_backend
from icefloe.topics.registry import TopicRegistry
from tests.compaction.test_compaction import comparable, read_all, records

VALUE_1K = b"v" * 1024


def spark_config(data_dir: Path) -> Config:
    """The embedded default with ``ICEFLOE_COMPACTION__BACKEND=spark``."""
    return load_config(
        env={"ICEFLOE_COMPACTION__BACKEND": "spark"},
        overrides={
            "data_dir": str(data_dir),
            "storage": {"flush_interval_ms": 2},
            "compaction": {"spark": QUICK_LOCAL_OPTIONS},
        },
    )


@pytest.fixture
async def storage(tmp_path: Path) -> AsyncIterator[StreamStorage]:
    async with await StreamStorage.open(spark_config(tmp_path)) as opened:
        yield opened


async def open_engine(name: str, storage: StreamStorage, tmp_path: Path) -> CompactionEngine:
    config = spark_config(tmp_path)
    options = QUICK_LOCAL_OPTIONS if name == "spark" else {"workers": 2}
    engine = await open_backend(
        PortKind.COMPACTION,
        name,
        tmp_path,
        options,
        storage.object_store,
        wal=storage.wal,
        config=config,
    )
    assert isinstance(engine, CompactionEngine)
    return engine


async def append_idempotent(storage: StreamStorage, stream: int, batches: int) -> None:
    """Idempotent batches: producer id, epoch and sequences land in the batch columns."""
    producer_id = await storage.allocate_producer_id()
    sequence = 0
    for i in range(batches):
        batch = make_records(f"p{stream}-{i}", 20, i * 20)
        numbered = [r._replace(offset=n) for n, r in enumerate(batch)]
        data = build_batch(
            numbered,
            compression=Compression.ZSTD,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=sequence,
        )
        await storage.append_batches(stream, data)
        sequence += len(batch)


def without_identity(file: WrittenFile) -> WrittenFile:
    return dataclasses.replace(file, task_id="", path="")


# --- equivalence with the in-process engine --------------------------------------------------


async def test_spark_and_in_process_engines_write_the_same_tables(
    shared_spark: SparkCompactionEngine, storage: StreamStorage, tmp_path: Path
) -> None:
    streams = await write_streams(storage, count=3, rounds=3)
    await append_idempotent(storage, streams[0].stream_id, batches=3)
    # Over 1 MiB in one stream: its file has several row groups.
    big = await storage.create_stream("big")
    for i in range(3):
        await storage.append(
            big, [Record(0, 1_700_000_000_000 + i, None, VALUE_1K) for _ in range(600)]
        )
    streams_and_big = [*streams, dataclasses.replace(streams[0], stream_id=big, partition=9)]
    local_task = await task_for(storage, streams_and_big, "local-task", "local")
    spark_task = dataclasses.replace(
        local_task,
        task_id="spark-task",
        output_paths=tuple((s, p.replace("local/", "spark/")) for s, p in local_task.output_paths),
    )
    local, spark = (
        await open_engine("local", storage, tmp_path),
        await open_engine("spark", storage, tmp_path),
    )
    try:
        local_files = await local.run([local_task])
        spark_files = await spark.run([spark_task])
    finally:
        await local.close()
        await spark.close()

    by_stream = {f.stream_id: f for f in local_files}
    assert sorted(by_stream) == sorted(f.stream_id for f in spark_files)
    assert any(len(f.row_groups) > 1 for f in spark_files)
    for spark_file in spark_files:
        local_file = by_stream[spark_file.stream_id]
        assert without_identity(spark_file) == without_identity(local_file)
        local_table = pq.read_table(io.BytesIO(await storage.object_store.get(local_file.path)))
        spark_table = pq.read_table(io.BytesIO(await storage.object_store.get(spark_file.path)))
        assert spark_table.schema == local_table.schema
        assert spark_table.to_pylist() == local_table.to_pylist()  # every column, every row


async def test_a_tasks_codecs_reach_the_files_spark_writes(
    shared_spark: SparkCompactionEngine, storage: StreamStorage, tmp_path: Path
) -> None:
    streams = await write_streams(storage, count=2, rounds=2)
    task = await task_for(storage, streams, "codec-task", "codec")
    snappy = streams[0].stream_id
    task = dataclasses.replace(task, codecs=((snappy, "snappy"),))
    spark = await open_engine("spark", storage, tmp_path)
    try:
        files = await spark.run([task])
    finally:
        await spark.close()

    codecs = {}
    for file in files:
        metadata = pq.ParquetFile(io.BytesIO(await storage.object_store.get(file.path))).metadata
        value = next(
            i for i in range(metadata.num_columns) if metadata.schema.column(i).path == "value"
        )
        codecs[file.stream_id] = metadata.row_group(0).column(value).compression
    assert codecs == {snappy: "SNAPPY", streams[1].stream_id: "ZSTD"}


async def test_a_compactor_on_spark_leaves_what_consumers_read_unchanged(
    shared_spark: SparkCompactionEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = spark_config(tmp_path)
    assert configuration.resolve_one(config, CompactionEngine).cls is SparkCompactionEngine
    jobs: list[int] = []
    collect = SparkCompactionEngine._collect

    def counted(self: SparkCompactionEngine, group: str, tasks: list[Any]) -> Any:
        jobs.append(len(tasks))
        return collect(self, group, tasks)

    monkeypatch.setattr(SparkCompactionEngine, "_collect", counted)
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            topic = await topics.create("orders", 2)
            for i, codec in enumerate(Compression):
                for stream in topic.streams:
                    await storage.append(stream, records(40, f"{codec.name}{i}"), compression=codec)
            before = {s: await read_all(storage, s) for s in topic.streams}
            assert await compactor.until_idle() == 1
            assert jobs == [1], "the task did not run as a Spark job"
            for stream in topic.streams:
                entries = await storage.index.scan(stream)
                assert [type(e.location) for e in entries] == [ParquetLocation]
                assert comparable(await read_all(storage, stream)) == comparable(before[stream])
        finally:
            await compactor.close()
            await topics.close()
    assert shared_spark.spark_context is not None, "the compactor's engine stopped the context"


# --- the SparkContext's lifecycle ------------------------------------------------------------


async def test_an_engine_borrowing_a_running_context_leaves_it_running_on_close(
    shared_spark: SparkCompactionEngine, storage: StreamStorage, tmp_path: Path
) -> None:
    engine = await open_engine("spark", storage, tmp_path)
    assert isinstance(engine, SparkCompactionEngine)
    await engine.start()
    assert engine.spark_context is shared_spark.spark_context
    await engine.close()
    running = shared_spark.spark_context
    assert running is not None
    assert running.parallelize([1, 2], 2).count() == 2


FRESH_PROCESS = """
import asyncio, json, os, sys
from pathlib import Path
from icefloe.config import load_config
from icefloe.cpu_affinity import pin_to_one_core
from icefloe.plugins import BackendRegistry
from icefloe.ports.base import PortKind
from icefloe.testing.contract import open_backend

async def main():
    facts = {}
    pin_to_one_core(0)  # as a broker process is
    BackendRegistry().installed()
    facts["pyspark_after_listing"] = "pyspark" in sys.modules
    config = load_config(env={"ICEFLOE_COMPACTION__BACKEND": "spark"})
    engine = await open_backend(
        PortKind.COMPACTION, "spark", Path("."), OPTIONS, config=config
    )
    facts["pyspark_after_open"] = "pyspark" in sys.modules
    await engine.start()
    facts["running_after_start"] = engine.spark_context is not None
    facts["worker_python"] = engine.spark_context.pythonExec
    facts["jvm_cores"] = sorted(os.sched_getaffinity(engine.spark_context._gateway.proc.pid))
    facts["own_cores"] = sorted(os.sched_getaffinity(0))
    await engine.close()
    from pyspark import SparkContext
    facts["running_after_close"] = SparkContext._active_spark_context is not None
    print(json.dumps(facts))

asyncio.run(main())
"""


def test_an_engine_starts_spark_on_first_use_and_stops_it_on_close(tmp_path: Path) -> None:
    # A fresh process, as a broker is: no context is running to borrow, and it runs on one core.
    cores = sorted(os.sched_getaffinity(0))
    script = f"OPTIONS = {QUICK_LOCAL_OPTIONS!r}\n" + textwrap.dedent(FRESH_PROCESS)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert (
        facts
        == {
            "pyspark_after_listing": False,
            "pyspark_after_open": False,
            "running_after_start": True,
            "worker_python": sys.executable,  # local mode: this interpreter, which has Icefloe
            "jvm_cores": cores,  # not confined to the broker's core
            "own_cores": cores[:1],
            "running_after_close": False,
        }
    )


# --- what executors need ---------------------------------------------------------------------


UNPICKLE_WITHOUT_PLUGIN = """
import pickle, sys
sys.modules["icefloe_compaction_spark"] = None  # any import of the plugin now fails
job = pickle.loads(sys.stdin.buffer.read())
print(job.func.__module__, type(job.args[0]).__name__)
"""


def test_executors_need_icefloe_but_not_this_plugin(
    shared_spark: SparkCompactionEngine, tmp_path: Path
) -> None:
    # What the engine ships per task: the executor function bound to the configuration.
    from icefloe_compaction_spark import engine, executor
    from pyspark import cloudpickle

    engine._ship_by_value()
    job = functools.partial(executor.run_task, spark_config(tmp_path))
    done = subprocess.run(
        [sys.executable, "-c", UNPICKLE_WITHOUT_PLUGIN],
        input=cloudpickle.dumps(job),  # type: ignore[no-untyped-call]
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().split() == ["icefloe_compaction_spark.executor", "Config"]


async def test_a_permanent_task_error_is_returned_typed_rather_than_raised(
    storage: StreamStorage, tmp_path: Path
) -> None:
    # Raising would make Spark retry a task that cannot succeed, and lose the error's type.
    from icefloe_compaction_spark.executor import run_task

    [stream] = await write_streams(storage, count=1, rounds=3)
    task = await task_for(storage, [stream], "t", "out")
    gapped = dataclasses.replace(task, ranges=(task.ranges[0], task.ranges[2]))
    files, _, error = await asyncio.to_thread(run_task, spark_config(tmp_path), gapped)
    assert files == []
    assert isinstance(error, CorruptDataError)
    assert isinstance(pickle.loads(pickle.dumps(error)), CorruptDataError)


def test_a_retriable_task_error_is_raised_for_spark_to_retry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from icefloe_compaction_spark import executor

    def unavailable(config: Config, task: CompactionTask) -> WorkerResult:
        raise UnavailableError("object store throttled")

    monkeypatch.setattr(executor, "run_task_in_worker", unavailable)
    with pytest.raises(UnavailableError):
        executor.run_task(spark_config(tmp_path), CompactionTask("t", (), ()))


# --- options ---------------------------------------------------------------------------------


def test_conf_takes_spark_properties_only() -> None:
    with pytest.raises(ValidationError, match="not a Spark property"):
        SparkCompactionOptions.model_validate({"conf": {"executor.memory": "4g"}})


@pytest.mark.parametrize(
    ("key", "option"), [("spark.master", "master"), ("spark.pyspark.python", "python")]
)
def test_conf_rejects_properties_that_have_an_option(key: str, option: str) -> None:
    with pytest.raises(ValidationError, match=f"option '{option}'"):
        SparkCompactionOptions.model_validate({"conf": {key: "x"}})


def test_conf_values_from_toml_become_spark_strings() -> None:
    options = SparkCompactionOptions.model_validate(
        {"conf": {"spark.ui.enabled": False, "spark.executor.cores": 4}}
    )
    assert options.conf == {"spark.ui.enabled": "false", "spark.executor.cores": "4"}


@pytest.mark.parametrize(
    ("master", "local"),
    [("local", True), ("local[*]", True), ("local[4,2]", True), ("spark://h:7077", False)],
)
def test_local_masters_are_recognised(master: str, local: bool) -> None:
    options = SparkCompactionOptions(master=master)
    assert options.is_local is local
    # Only local executors share the host's cores with its brokers' clients.
    assert SparkCompactionEngine(load_config(env={}), options).runs_on_this_host() is local


def test_the_options_come_from_the_config_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "icefloe.toml"
    path.write_text(
        textwrap.dedent(
            """
            [compaction]
            backend = "spark"

            [compaction.spark]
            master = "spark://spark-master:7077"

            [compaction.spark.conf]
            "spark.executor.memory" = "4g"
            """
        )
    )
    config = load_config(path, env={"ICEFLOE_COMPACTION__SPARK__APP_NAME": "icefloe-prod"})
    options: Any = configuration.resolve_one(config, CompactionEngine).options
    assert (options.master, options.app_name, options.conf) == (
        "spark://spark-master:7077",
        "icefloe-prod",
        {"spark.executor.memory": "4g"},
    )
