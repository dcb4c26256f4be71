"""``icefloe users``: the SASL users of a cluster (SCRAM credentials in the metadata store).

Brokers read credentials at each login, so a change applies to the next login, without a
restart. Passwords are read from a prompt or from standard input, never from the command line
(it would stay in the shell history and show in the process list).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from icefloe.cli import data_dir
from icefloe.cli.data_dir import data_dir_option

if TYPE_CHECKING:
    from icefloe.security.users import UserStore

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])
_MECHANISMS = click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"])


def _mechanism_option(text: str) -> Callable[[F], F]:
    return click.option("--mechanism", "mechanisms", type=_MECHANISMS, multiple=True, help=text)


@click.group("users")
@data_dir_option
def users() -> None:
    """Add, list and delete SASL users (SCRAM-SHA-256/512; PLAIN logins use the same)."""


def _run(
    ctx: click.Context, work: Callable[[UserStore], Awaitable[T]], *, must_exist: bool = True
) -> T:
    from icefloe import config as configuration
    from icefloe.ports import MetadataStore
    from icefloe.ports.base import OpenContext
    from icefloe.security.users import UserStore

    config = data_dir.load(ctx, must_exist=must_exist)

    async def main() -> T:
        backend = configuration.resolve_one(config, MetadataStore)
        metadata = await backend.open(OpenContext(data_dir=config.data_dir))
        try:
            return await work(UserStore(metadata))
        finally:
            await metadata.close()

    return asyncio.run(main())


@users.command("add")
@data_dir_option
@click.argument("name")
@_mechanism_option("Credential to store (repeatable; default: both).")
@click.option("--iterations", type=click.IntRange(4096, 16384), default=8192, show_default=True)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.pass_context
def add(
    ctx: click.Context,
    name: str,
    mechanisms: tuple[str, ...],
    iterations: int,
    password_stdin: bool,
) -> None:
    """Add user NAME, or set a new password for it (before the first start too)."""
    from icefloe.security.users import ScramCredential, check_user_name

    try:
        check_user_name(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    if not password:
        raise click.BadParameter("the password is empty", param_hint="password")
    chosen = mechanisms or ("SCRAM-SHA-256", "SCRAM-SHA-512")

    async def work(store: UserStore) -> None:
        for mechanism in chosen:
            credential = await asyncio.to_thread(
                ScramCredential.from_password, mechanism, password, iterations
            )
            await store.put(name, credential)

    _run(ctx, work, must_exist=False)  # users may be set up before the first start
    click.echo(f"user {name}: {', '.join(chosen)} credentials stored ({iterations} iterations)")


@users.command("list")
@data_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_command(ctx: click.Context, as_json: bool) -> None:
    """Every user and the mechanisms it can log in with."""

    async def work(store: UserStore) -> dict[str, list[tuple[str, int]]]:
        return {
            name: [(c.mechanism, c.iterations) for c in credentials]
            for name, credentials in sorted((await store.users()).items())
        }

    found = _run(ctx, work)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"user": n, "credentials": [{"mechanism": m, "iterations": i} for m, i in c]}
                    for n, c in found.items()
                ],
                indent=2,
            )
        )
        return
    if not found:
        click.echo("no users: add one with `icefloe users add NAME`")
    for name, credentials in found.items():
        click.echo(f"{name}  " + ", ".join(f"{m} ({i} iterations)" for m, i in credentials))


@users.command("delete")
@data_dir_option
@click.argument("name")
@_mechanism_option("Credential to delete (repeatable; default: every one).")
@click.pass_context
def delete(ctx: click.Context, name: str, mechanisms: tuple[str, ...]) -> None:
    """Delete user NAME (or some of its credentials); its open connections stay logged in."""
    chosen = mechanisms or ("SCRAM-SHA-256", "SCRAM-SHA-512")

    async def work(store: UserStore) -> list[str]:
        return [m for m in chosen if await store.delete(name, m)]

    deleted = _run(ctx, work)
    if not deleted:
        click.echo(f"error: user {name!r} has no {' or '.join(chosen)} credential", err=True)
        sys.exit(2)
    click.echo(f"user {name}: {', '.join(deleted)} credentials deleted")
