"""``--data-dir`` for the commands that work on a cluster's storage, and the check that the data
is there: run in the wrong folder, a command would otherwise start an empty cluster of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from icefloe import config as configuration
from icefloe.errors import IcefloeError

F = TypeVar("F", bound=Callable[..., Any])


def _remember(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.obj.setdefault("overrides", {})["data_dir"] = value


def data_dir_option(command: F) -> F:
    """Add ``--data-dir`` to a command or group. A group's subcommands need it too, for
    ``icefloe topics list --data-dir X`` as well as ``icefloe topics --data-dir X list``."""
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        expose_value=False,
        callback=_remember,
        help="Data folder (embedded backends); default: data_dir of the configuration.",
    )(command)


def load(ctx: click.Context, *, must_exist: bool = True) -> configuration.Config:
    """The configuration, with ``--data-dir`` applied.

    Raises:
        IcefloeError: ``must_exist`` and the embedded metadata store's folder is missing.
    """
    config = configuration.load_config(
        ctx.obj.get("config_path"), overrides=ctx.obj.get("overrides")
    )
    metadata = config.metadata
    embedded = metadata.backend == "sqlite" and not metadata.options_for("sqlite").get("path")
    if must_exist and embedded and not config.data_dir.is_dir():
        raise IcefloeError(
            f"no Icefloe data in {config.data_dir.resolve()}: run this where `icefloe serve` "
            "keeps its data, or pass --data-dir (or set data_dir in the configuration)"
        )
    return config
