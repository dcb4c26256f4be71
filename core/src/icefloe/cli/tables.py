"""``icefloe compact``, ``icefloe maintain`` and ``icefloe tables``: compaction and table
maintenance by hand, and where the tables are."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from icefloe.cli import data_dir
from icefloe.cli.data_dir import data_dir_option
from icefloe.compaction.committer import TaskRecord
from icefloe.compaction.leadership import UNLEADED, Lease
from icefloe.compaction.service import LEADER_KEY, Compactor, Progress
from icefloe.errors import (
    AlreadyExistsError,
    ConflictError,
    IcefloeError,
    NotFoundError,
    StorageError,
    UnavailableError,
)
from icefloe.ports.metadata import MUST_NOT_EXIST
from icefloe.ports.table import TableFormat, TableSpec
from icefloe.schemas import columns
from icefloe.storage.engine import StreamStorage
from icefloe.storage.index import ParquetLocation
from icefloe.storage.parquet_reader import ParquetRangeReader
from icefloe.tables import layout
from icefloe.topics.configs import typed_sides
from icefloe.topics.registry import Topic, TopicRegistry

T = TypeVar("T")


@asynccontextmanager
async def _compactor(ctx: click.Context) -> AsyncIterator[Compactor]:
    config = data_dir.load(ctx)
    async with await StreamStorage.open(config) as storage:
        topics = TopicRegistry(storage, config.table.identifier)
        await topics.start()
        compactor = await Compactor.open(config, storage, topics)
        try:
            yield compactor
        finally:
            await compactor.close()
            await topics.close()


def _run(ctx: click.Context, body: Callable[[Compactor], Awaitable[T]]) -> T:
    async def main() -> T:
        async with _compactor(ctx) as compactor:
            return await body(compactor)

    return asyncio.run(main())


def _engine_overrides(
    ctx: click.Context, engine: str | None, master: str | None, spark_conf: tuple[str, ...]
) -> None:
    """Apply ``--engine``, ``--master`` and ``--spark-conf`` as configuration overrides."""
    overrides = ctx.obj.setdefault("overrides", {})
    compaction = overrides.setdefault("compaction", {})
    if engine is not None:
        compaction["backend"] = engine
    spark: dict[str, Any] = {}
    if master is not None:
        spark["master"] = master
    for item in spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--spark-conf")
        spark.setdefault("conf", {})[key] = value
    if spark:
        chosen = engine or data_dir.load(ctx, must_exist=False).compaction.backend
        if chosen != "spark":
            raise click.UsageError(
                "--master and --spark-conf need the spark engine (--engine spark)"
            )
        compaction["spark"] = spark


@click.command()
@data_dir_option
@click.option("--until-idle", is_flag=True, help="Compact everything now, ignoring ages and sizes.")
@click.option(
    "--engine", help="Compaction engine for this command ([compaction] backend): local, spark."
)
@click.option("--master", help="Spark master URL ([compaction.spark] master), e.g. spark://h:7077.")
@click.option(
    "--spark-conf",
    multiple=True,
    metavar="KEY=VALUE",
    help="A Spark property for this command ([compaction.spark.conf]); repeatable.",
)
@click.pass_context
def compact(
    ctx: click.Context,
    until_idle: bool,
    engine: str | None,
    master: str | None,
    spark_conf: tuple[str, ...],
) -> None:
    """Compact streams into Parquet and commit them to the configured tables.

    Without --until-idle, runs one round as the background compactor would. With it, a bar
    moves with the WAL bytes compacted and counts the tasks finished (without a terminal, one
    line per run of tasks). Refuses to run while a broker leads compaction (stop `icefloe
    serve` or let it do the work). --engine spark --master URL runs the tasks on a Spark
    cluster, with this process as the driver.
    """
    _engine_overrides(ctx, engine, master, spark_conf)

    async def body(compactor: Compactor) -> None:
        async with _leading(compactor):
            if not until_idle:
                progress = await compactor.compact_once()
                click.echo(_describe(progress) if progress else "nothing is due for compaction")
                return
            waiting = sum([(await compactor.backlog(t))[1] for t in compactor.topics.cached()])
            done = _Done()
            terminal = sys.stdout.isatty()
            with click.progressbar(
                length=max(waiting, 1), label="compacting", item_show_func=lambda text: text
            ) as bar:

                def label() -> str:
                    finished = compactor.engine.tasks_finished() - first
                    return f"{done.records} records, {_count(finished, 'task')} done"

                def report(progress: Progress) -> None:
                    done.add(progress)
                    if not terminal:  # the bar shows only in a terminal: a line per run instead
                        click.echo(_describe(progress))
                    bar.update(progress.source_bytes, label())

                async def follow_tasks() -> None:
                    while True:  # tasks end within a run: move the label with them
                        await asyncio.sleep(0.5)
                        bar.update(0, label())

                first = compactor.engine.tasks_finished()
                follower = asyncio.create_task(follow_tasks()) if terminal else None
                try:
                    tasks = await compactor.until_idle(report)
                finally:
                    if follower is not None:
                        follower.cancel()
            click.echo(
                f"compacted {done.records} records in {_count(tasks, 'task')}: "
                f"{done.source_bytes} WAL bytes into {done.parquet_bytes} Parquet bytes"
                if tasks
                else "nothing to compact"
            )

    _run(ctx, body)


@dataclass
class _Done:
    """What the tasks of a run compacted so far."""

    records: int = 0
    source_bytes: int = 0
    parquet_bytes: int = 0

    def add(self, progress: Progress) -> None:
        self.records += progress.records
        self.source_bytes += progress.source_bytes
        self.parquet_bytes += progress.parquet_bytes


@click.command()
@data_dir_option
@click.pass_context
def maintain(ctx: click.Context) -> None:
    """Maintain the tables now: merge small data files, delete unreferenced ones.

    Runs what the background compactor does every [compactor] maintenance_interval_s, with
    each topic's icefloe.table.* configs. Refuses to run while a broker leads compaction.
    """

    async def body(compactor: Compactor) -> None:
        async with _leading(compactor):
            rewrites = 0
            while (progress := await compactor.rewrite_once()) is not None:
                rewrites += 1
                click.echo(
                    f"merged {progress.records} records: {progress.source_bytes} bytes of small "
                    f"files into one file of {progress.parquet_bytes} bytes"
                )
            deleted = await compactor.collect_garbage()
            click.echo(f"{rewrites} rewrites, {len(deleted)} unreferenced files deleted")

    _run(ctx, body)


@asynccontextmanager
async def _leading(compactor: Compactor) -> AsyncIterator[None]:
    """Hold the compaction leadership for the block, or refuse if a broker holds it. The
    command's steps are fenced by its lease as a broker's are (:mod:`icefloe.compaction.
    leadership`): if the metadata store stops answering, it stops before a broker can lead."""
    metadata = compactor.storage.metadata
    async with await metadata.open_session(10.0) as session:
        try:
            won = await metadata.put(
                LEADER_KEY, b"cli", expected_version=MUST_NOT_EXIST, session=session
            )
        except AlreadyExistsError:
            raise IcefloeError(
                "a running broker leads compaction; stop `icefloe serve` first, or let it "
                "compact (it runs every [compactor] interval_s)"
            ) from None
        compactor.committer.lease = Lease(session, won.version)
        try:
            yield
        finally:
            compactor.committer.lease = UNLEADED


@click.group(invoke_without_command=True)
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def tables(ctx: click.Context, as_json: bool) -> None:
    """Show each topic's tables: identifier, locations, version, data files and lag behind the
    stream, and the compaction runs set aside after failing repeatedly (why, and when they
    are tried again)."""
    if ctx.invoked_subcommand is not None:
        return

    async def body(compactor: Compactor) -> list[dict[str, Any]]:
        rows = []
        aside = _set_aside_by_topic(await compactor.committer.unfinished())
        for topic in compactor.topics.cached():
            lag, _ = await compactor.backlog(topic)
            spec = compactor.committer.table_spec(topic.name)
            dead = await _dead_letters(compactor, topic)
            store = compactor.storage.object_store
            letters = layout.dead_letter_spec(store, spec, topic.name)
            for name, table_format in compactor.table_formats.items():
                row = {"topic": topic.name, "format": name, "lag_records": lag}
                row |= await _describe_table(table_format, spec)
                row["set_aside"] = aside.get(topic.name, [])
                if dead is not None:  # a schema-backed topic: its dead letters and their table
                    row["dead_letters"] = dead
                    row["dead_letter_table"] = await _describe_table(table_format, letters)
                rows.append(row)
            if not compactor.table_formats:
                rows.append(
                    {
                        "topic": topic.name,
                        "format": None,
                        "identifier": spec.identifier,
                        "location": spec.location,
                        "metadata_location": None,
                        "commit": None,
                        "files": None,
                        "lag_records": lag,
                        "set_aside": aside.get(topic.name, []),
                    }
                )
        return rows

    rows = _run(ctx, body)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no topics")
    for row in rows:
        click.echo(
            f"{row['topic']}: {row['format'] or 'no table format enabled'} "
            f"{row['identifier']} at {row['location']}"
            + (f" (metadata {row['metadata_location']})" if row["metadata_location"] else "")
            + (f", commit {row['commit']}" if row["commit"] is not None else ", not created yet")
            + (f", {_count(row['files'], 'data file')}" if row["files"] is not None else "")
            + f", {row['lag_records']} records not yet in the table"
            + (f", {_count(row['dead_letters'], 'dead letter')}" if "dead_letters" in row else "")
        )
        for run in row["set_aside"]:
            click.echo(
                f"{row['topic']}: compaction run {run['run']} of partitions "
                f"{', '.join(map(str, run['partitions']))} set aside after {run['failures']} "
                f"failures ({run['state']}): {run['error']}; its partitions wait, tried again "
                f"at {run['retry_at']} or now with `icefloe tables retry`"
            )
        if letters := row.get("dead_letter_table"):
            click.echo(
                f"{row['topic']}: {row['format']} dead letters {letters['identifier']} at "
                f"{letters['location']}"
                + (
                    f" (metadata {letters['metadata_location']})"
                    if letters["metadata_location"]
                    else ""
                )
                + (
                    f", commit {letters['commit']}"
                    if letters["commit"] is not None
                    else ", none yet"
                )
            )


@tables.command()
@data_dir_option
@click.pass_context
def retry(ctx: click.Context) -> None:
    """Try the compaction runs set aside again now, instead of after their back-off.

    Fix what failed first (`icefloe tables` says what it was): the compaction leader tries each
    run in its next round, and sets it aside again if it fails again.
    """

    async def body(compactor: Compactor) -> list[TaskRecord]:
        return await compactor.committer.retry_set_aside()

    retried = _run(ctx, body)
    for record in retried:
        click.echo(
            f"compaction run {record.run_id}{record.suffix} of {', '.join(record.topics)}: "
            "tried again in the compaction leader's next round"
        )
    if not retried:
        click.echo("no compaction run is set aside")


def _set_aside_by_topic(records: list[TaskRecord]) -> dict[str, list[dict[str, Any]]]:
    """The set-aside runs among ``records``, described per topic they hold."""
    now_ms = int(time.time() * 1000)
    found: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if not record.set_aside(now_ms):
            continue
        for topic in record.topics:
            found.setdefault(topic, []).append(
                {
                    "run": record.run_id + record.suffix,
                    "state": str(record.state),
                    "partitions": sorted(s.partition for s in record.streams if s.topic == topic),
                    "failures": record.failures,
                    "error": record.error,
                    "retry_at": time.strftime(
                        "%Y-%m-%dT%H:%M:%S%z", time.localtime(record.retry_after_ms / 1000)
                    ),
                }
            )
    return found


async def _dead_letters(compactor: Compactor, topic: Topic) -> int | None:
    """The records of a schema-backed topic's data files that did not decode (``None`` for a
    raw topic), from each data file's footer: one ranged read per file."""
    sides = typed_sides(topic.configs)
    if not sides:
        return None
    reader = ParquetRangeReader(compactor.storage.object_store)
    dead = 0
    for stream in topic.streams:
        async for entry in compactor.storage.index.entries(stream):
            if isinstance(entry.location, ParquetLocation):
                footer = await reader.metadata(entry.location.key, entry.location.size)
                dead += columns.dead_letters_in_footer(footer, sides)
    return dead


async def _describe_table(table_format: TableFormat, spec: TableSpec) -> dict[str, Any]:
    """Where the table is and how far it got, without creating it: the first compaction of
    the topic does that, and a table the CLI created could race the broker's."""
    missing = {
        "identifier": spec.identifier,
        "location": spec.location,
        "metadata_location": None,
        "commit": None,
        "files": None,
    }
    for attempt in range(2):
        try:
            commit = await _patiently(lambda: table_format.last_commit(spec))
            info = await _patiently(lambda: table_format.ensure_table(spec))
            files = await _patiently(lambda: table_format.files(spec))
            break
        except NotFoundError:  # not created yet, or dropped meanwhile with its deleted topic
            return missing
        except StorageError:
            # A table dropped while it is read may fail on a file it listed a moment before
            # (Delta's log): read it again, as it is now, and fail only if it fails again.
            if attempt:
                raise
    return {
        "identifier": info.identifier,
        "location": info.location,
        "metadata_location": info.metadata_location,
        "commit": commit,
        "files": len(files),
    }


async def _patiently(read: Callable[[], Awaitable[T]], attempts: int = 5) -> T:
    """``read()``, retried while a running broker holds the catalog or races a commit."""
    for attempt in range(attempts):
        try:
            return await read()
        except (UnavailableError, ConflictError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.2 * 2**attempt)
    raise AssertionError("unreachable")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _describe(progress: Progress) -> str:
    tasks = f" in {_count(progress.tasks, 'task')}" if progress.tasks > 1 else ""
    return (
        f"compacted {progress.records} records of {_count(progress.streams, 'stream')}{tasks}: "
        f"{progress.source_bytes} WAL bytes into {progress.parquet_bytes} Parquet bytes"
    )
