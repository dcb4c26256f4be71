"""``icefloe groups``: list consumer groups and describe their members, assignments and lag.

Like ``icefloe topics``, it reads the configured storage directly, so it works whether
brokers run or not.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from icefloe.cli import data_dir
from icefloe.cli.data_dir import data_dir_option
from icefloe.errors import IcefloeError

if TYPE_CHECKING:
    from icefloe.storage.engine import StreamStorage

T = TypeVar("T")


@click.group("groups")
@data_dir_option
def groups() -> None:
    """List consumer groups; describe members, assignments, committed offsets and lag."""


def _run(ctx: click.Context, work: Callable[[StreamStorage], Awaitable[T]]) -> T:
    from icefloe.storage.engine import StreamStorage

    config = data_dir.load(ctx)

    async def main() -> T:
        storage = await StreamStorage.open(config)
        try:
            return await work(storage)
        finally:
            await storage.close()

    return asyncio.run(main())


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str("-" if c is None else c) for c in row] for row in rows]
    widths = [max(len(x) for x in col) for col in zip(headers, *cells, strict=False)]
    for line in [list(headers), *cells]:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


@groups.command("list")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """Every group with its type, state and generation or epoch."""
    from icefloe.groups.inspect import list_groups

    views = _run(ctx, list_groups)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(v) for v in views], indent=2))
        return
    _table(
        ["GROUP", "TYPE", "STATE", "EPOCH", "PROTOCOL"],
        [[v.group_id, v.type, v.state, v.epoch, v.protocol or None] for v in views],
    )


@groups.command("describe")
@data_dir_option
@click.argument("group_id")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def describe_command(ctx: click.Context, group_id: str, as_json: bool) -> None:
    """Members and their assignments, then committed offset, log end and lag per partition."""
    from icefloe.groups.inspect import describe_group

    view = _run(ctx, lambda storage: describe_group(storage, group_id))
    if view is None:
        raise IcefloeError(f"group {group_id!r} does not exist; see `icefloe groups list`")
    if as_json:
        data = dataclasses.asdict(view)
        for row, partition in zip(data["partitions"], view.partitions, strict=True):
            row["lag"] = partition.lag
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(
        f"group {view.group_id}: {view.type}, {view.state}, epoch {view.epoch}, "
        f"{view.protocol or 'no protocol'}, {len(view.members)} member(s)"
    )
    click.echo()
    _table(
        ["MEMBER", "INSTANCE", "CLIENT", "HOST", "ASSIGNMENT"],
        [
            [
                m.member_id,
                m.instance_id,
                m.client_id,
                m.client_host,
                " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in m.assignment.items()) or None,
            ]
            for m in view.members
        ],
    )
    click.echo()
    _table(
        ["TOPIC", "PARTITION", "COMMITTED", "LOG-END", "LAG", "OWNER"],
        [[p.topic, p.partition, p.committed, p.log_end, p.lag, p.owner] for p in view.partitions],
    )
