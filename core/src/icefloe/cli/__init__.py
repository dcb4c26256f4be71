"""The ``icefloe`` command."""

from __future__ import annotations

import importlib
import sys

import click

from icefloe.errors import IcefloeError

_COMMANDS = {
    "plugins": "icefloe.cli.commands:plugins",
    "config": "icefloe.cli.commands:config_group",
    "contract-test": "icefloe.cli.commands:contract_test",
    "serve": "icefloe.cli.commands:serve",
    "compact": "icefloe.cli.tables:compact",
    "maintain": "icefloe.cli.tables:maintain",
    "tables": "icefloe.cli.tables:tables",
    "topics": "icefloe.cli.topics:topics",
    "groups": "icefloe.cli.groups:groups",
    "cost": "icefloe.cli.cost:cost",
    "users": "icefloe.cli.users:users",
}
"""Each command and where it is defined: a command's module is imported when it runs (or for
``--help``), so ``icefloe serve`` does not import what compaction or table commands need, nor
do the processes it starts that import this module again."""


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = _COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, name = where.split(":")
        command = getattr(importlib.import_module(module), name)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
