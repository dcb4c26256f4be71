"""``icefloe topics``: create, list, describe and delete topics without a Kafka admin tool.

The commands open the configured storage directly (the configuration ``icefloe serve`` reads:
``--config``, ``ICEFLOE_*`` variables), so they work whether brokers run or not. Running
brokers see a change at once: topic records live in the metadata store, which they follow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
from kio.schema.errors import ErrorCode

from icefloe import config as configuration
from icefloe.cli import data_dir
from icefloe.cli.data_dir import data_dir_option

if TYPE_CHECKING:
    # The storage engine and kio take a while to import: only these commands need them.
    from icefloe.storage.engine import StreamStorage
    from icefloe.topics.configs import ConfigEntry
    from icefloe.topics.registry import Topic, TopicRegistry

T = TypeVar("T")

_SOURCES = {
    "DYNAMIC_TOPIC_CONFIG": "topic",
    "STATIC_BROKER_CONFIG": "broker",
    "DEFAULT_CONFIG": "default",
}


@click.group("topics")
@data_dir_option
def topics() -> None:
    """Create, list, describe and delete topics, straight in the configured storage."""


def _run(
    ctx: click.Context,
    work: Callable[[TopicRegistry, StreamStorage, configuration.Config], Awaitable[T]],
    *,
    creates: bool = False,
) -> T:
    """Open the storage, run ``work`` with a topic registry over it, close everything.

    Only a command that ``creates`` a topic may start a new data folder.
    """
    from icefloe.storage.engine import StreamStorage
    from icefloe.topics.registry import TopicRegistry

    config = data_dir.load(ctx, must_exist=not creates)

    async def main() -> T:
        storage = await StreamStorage.open(config)
        try:
            return await work(TopicRegistry(storage, config.table.identifier), storage, config)
        finally:
            await storage.close()

    return asyncio.run(main())


def _parse_configs(
    _ctx: click.Context, _param: click.Parameter, values: Sequence[str]
) -> dict[str, str]:
    configs: dict[str, str] = {}
    for text in values:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"{text!r}: expected KEY=VALUE, e.g. retention.ms=86400000")
        configs[name.strip()] = value
    return configs


@topics.command("create")
@data_dir_option
@click.argument("name")
@click.option(
    "--partitions",
    "-p",
    type=click.IntRange(min=1),
    help="Partition count (default: broker.default_partitions).",
)
@click.option(
    "--config",
    "-c",
    "configs",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_configs,
    help="Topic config, e.g. retention.ms=86400000. Repeatable.",
)
@click.pass_context
def create(ctx: click.Context, name: str, partitions: int | None, configs: dict[str, str]) -> None:
    """Create the topic NAME."""

    async def work(
        registry: TopicRegistry, storage: StreamStorage, config: configuration.Config
    ) -> Topic:
        from icefloe.topics.configs import validate

        count = partitions or config.broker.default_partitions
        return await registry.create(name, count, validate(configs, config.storage))

    topic = _run(ctx, work, creates=True)
    plural = "s" if topic.partitions != 1 else ""
    click.echo(
        f"created topic {topic.name} ({topic.partitions} partition{plural}, id {topic.topic_id})"
    )


@topics.command("list")
@data_dir_option
@click.pass_context
def list_topics(ctx: click.Context) -> None:
    """List every topic: name, partition count and topic id."""

    async def work(
        registry: TopicRegistry, storage: StreamStorage, config: configuration.Config
    ) -> list[Topic]:
        await registry.start()
        try:
            return registry.cached()
        finally:
            await registry.close()

    rows = [[t.name, t.partitions, t.topic_id] for t in _run(ctx, work)]
    _table(["NAME", "PARTITIONS", "ID"], rows)


@topics.command("describe")
@data_dir_option
@click.argument("name")
@click.pass_context
def describe(ctx: click.Context, name: str) -> None:
    """Show the topic NAME: its partitions (stream id, log start and end) and its configs."""

    async def work(
        registry: TopicRegistry, storage: StreamStorage, config: configuration.Config
    ) -> tuple[Topic, list[list[Any]], list[ConfigEntry]]:
        from icefloe.topics.configs import describe
        from icefloe.topics.registry import TopicError

        topic = await registry.get(name)
        if topic is None:
            raise TopicError(ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
        partitions = [
            [index, stream, await storage.log_start(stream), await storage.log_end(stream)]
            for index, stream in enumerate(topic.streams)
        ]
        return topic, partitions, describe(topic.configs, config.storage)

    topic, partitions, configs = _run(ctx, work)
    click.echo(f"topic {topic.name}  id {topic.topic_id}  partitions {topic.partitions}")
    click.echo()
    _table(["PARTITION", "STREAM", "LOG-START", "LOG-END"], partitions)
    click.echo()
    _table(
        ["CONFIG", "VALUE", "SOURCE"], [[c.name, c.value, _SOURCES[c.source.name]] for c in configs]
    )


@topics.command("delete")
@data_dir_option
@click.argument("name")
@click.pass_context
def delete(ctx: click.Context, name: str) -> None:
    """Delete the topic NAME and its data."""

    async def work(
        registry: TopicRegistry, storage: StreamStorage, config: configuration.Config
    ) -> Topic:
        return await registry.delete(name)

    topic = _run(ctx, work)
    click.echo(f"deleted topic {topic.name} (id {topic.topic_id})")


def _table(headers: list[str], rows: list[list[Any]]) -> None:
    cells = [headers, *([("-" if c is None else str(c)) for c in row] for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    for line in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
