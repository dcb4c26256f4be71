"""The ``icefloe`` command."""

from __future__ import annotations

import sys

import click

from icefloe.cli.commands import config_group, contract_test, plugins, serve
from icefloe.cli.cost import cost
from icefloe.cli.groups import groups
from icefloe.cli.tables import compact, maintain, tables
from icefloe.cli.topics import topics
from icefloe.cli.users import users
from icefloe.errors import IcefloeError


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="icefloe")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="ICEFLOE_CONFIG",
    help="TOML configuration file (default: $ICEFLOE_CONFIG, else built-in defaults).",
)
@click.pass_context
def cli(ctx: click.Context, config_path: str | None) -> None:
    """Icefloe: a Kafka-compatible streaming engine whose topics are lakehouse tables."""
    ctx.obj = {"config_path": config_path}


cli.add_command(plugins)
cli.add_command(config_group)
cli.add_command(contract_test)
cli.add_command(serve)
cli.add_command(compact)
cli.add_command(maintain)
cli.add_command(tables)
cli.add_command(topics)
cli.add_command(groups)
cli.add_command(cost)
cli.add_command(users)


def main(argv: list[str] | None = None) -> None:
    """Entry point: one-line errors instead of tracebacks for Icefloe's own errors."""
    try:
        result = cli.main(args=argv, prog_name="icefloe", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except IcefloeError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    sys.exit(result if isinstance(result, int) else 0)
