"""``icefloe plugins``, ``icefloe config``, ``icefloe contract-test``."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import tomli_w

from icefloe import config as configuration
from icefloe.cli import data_dir
from icefloe.cli.data_dir import data_dir_option
from icefloe.errors import ConfigError, IcefloeError
from icefloe.plugins import BackendRegistry
from icefloe.ports import PORTS, WAL, CompactionEngine, MetadataStore, ObjectStore, PortKind

_KIND_CHOICES = click.Choice([kind.value for kind in PortKind])


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List installed backends per port, with distribution, version and capabilities."""
    rows: list[dict[str, Any]] = []
    for backend in BackendRegistry().installed():
        try:
            capabilities = sorted(backend.load().capabilities)
            status = "ok"
        except IcefloeError as exc:
            capabilities, status = [], f"broken: {exc}"
        rows.append(
            {
                "port": backend.kind.value,
                "backend": backend.name,
                "distribution": backend.distribution,
                "version": backend.version,
                "capabilities": capabilities,
                "description": backend.spec.description,
                "status": status,
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    headers = ["PORT", "BACKEND", "DISTRIBUTION", "VERSION", "CAPABILITIES", "DESCRIPTION"]
    table = [
        [
            r["port"],
            r["backend"],
            r["distribution"],
            r["version"],
            ",".join(r["capabilities"]) or "-",
            r["description"] if r["status"] == "ok" else r["status"],
        ]
        for r in rows
    ]
    widths = [max(len(str(cell)) for cell in col) for col in zip(headers, *table, strict=False)]
    for line in [headers, *table]:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())


@click.group("config")
def config_group() -> None:
    """Inspect the effective configuration."""


@config_group.command("show")
@data_dir_option
@click.pass_context
def config_show(ctx: click.Context) -> None:
    """Print the effective configuration (file + environment + defaults), secrets masked."""
    config = data_dir.load(ctx, must_exist=False)
    click.echo(tomli_w.dumps(_without_none(configuration.masked(config))), nl=False)


@config_group.command("check")
@data_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds each backend has to open (loading its client library) and answer.",
)
@click.pass_context
def config_check(ctx: click.Context, timeout: float) -> None:
    """Validate every selected backend and its options, then open each backend as `serve`
    does and ask it one cheap question; exit 2 if a setting is invalid or a backend is
    unreachable."""
    from icefloe.cli import reachability

    config = data_dir.load(ctx, must_exist=False)
    registry = BackendRegistry()
    problems = 0
    for kind, port in PORTS.items():
        try:
            configuration.resolve(config, port, registry)
        except IcefloeError as exc:
            problems += 1
            click.echo(f"error: {kind.value}: {exc}", err=True)
    if problems:
        sys.exit(2)
    with _probe_dir(config.data_dir) as probe_dir:
        reached = reachability.run(config, probe_dir, timeout)
    for reach in reached:
        click.echo(reach.line())
    if not any(r.kind is PortKind.TABLE for r in reached):
        click.echo(f"{PortKind.TABLE.value}: (none)")
    engine = configuration.resolve(config, CompactionEngine, registry)
    names = ", ".join(b.name for b in engine) or "(none)"
    click.echo(f"{PortKind.COMPACTION.value}: {names} (not started by the check)")
    unreachable = [f"{r.kind.value} ({r.backend})" for r in reached if r.problem is not None]
    if unreachable:
        click.echo(f"error: unreachable: {', '.join(unreachable)}", err=True)
    if any(r.timed_out for r in reached):
        # A backend that did not answer still has calls running on its SDK's threads, and a
        # normal exit would wait for them (as long as the SDK's own timeouts and retries).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(2)
    if unreachable:
        sys.exit(2)


@contextlib.contextmanager
def _probe_dir(configured: Path) -> Iterator[Path]:
    """The data folder to open the backends in: a temporary one while the configured folder
    does not exist, so that a check creates no empty data folder for other commands to find."""
    if configured.is_dir():
        yield configured
        return
    click.echo(
        f"data_dir: {configured.resolve()} does not exist yet (`icefloe serve` creates it); "
        "backends that keep files there are checked in a temporary folder"
    )
    with tempfile.TemporaryDirectory(prefix="icefloe-check-") as tmp:
        yield Path(tmp)


@click.command("contract-test")
@click.argument("kind", type=_KIND_CHOICES)
@click.argument("name")
@click.option(
    "--option",
    "-o",
    "options",
    multiple=True,
    metavar="KEY=VALUE",
    help="Backend option (TOML value or string); '{unique}' and '{workdir}' are substituted "
    "per test instance. Repeatable.",
)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def contract_test(
    kind: str, name: str, options: tuple[str, ...], pytest_args: tuple[str, ...]
) -> int:
    """Run the contract suite of port KIND against the installed backend NAME.

    Extra arguments after `--` go to pytest, e.g. `icefloe contract-test metadata mine -- -x -q`.
    Needs `pip install 'icefloe[testing]'`.
    """
    try:
        import pytest
    except ImportError:
        raise ConfigError(
            "the contract suites need pytest: pip install 'icefloe[testing]'"
        ) from None
    from icefloe.testing import CONTRACTS

    port = PortKind(kind)
    BackendRegistry().get(port, name)  # fail early, with the pip install hint, if missing
    if port not in CONTRACTS:
        raise ConfigError(f"no contract suite exists yet for the {kind} port")
    parsed = dict(_parse_option(o) for o in options)
    with tempfile.TemporaryDirectory(prefix="icefloe-contract-") as tmp:
        test_file = Path(tmp) / f"test_contract_{port.value}_{name}.py"
        test_file.write_text(_opt_in_module(CONTRACTS[port], name, parsed))
        return int(pytest.main([str(test_file), "-p", "no:cacheprovider", *pytest_args]))


def _parse_option(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--option {text!r}: expected KEY=VALUE")
    return key.strip(), configuration.parse_value(raw)


def _opt_in_module(contract: str, name: str, options: dict[str, Any]) -> str:
    """Source of a test module opting ``name`` into ``contract`` (as a plugin author would)."""
    module, _, cls = contract.partition(":")
    return f'''"""Generated by `icefloe contract-test`."""
import json

from {module} import {cls}

_OPTIONS = json.loads({json.dumps(json.dumps(options))})


def _substitute(value, workdir, unique):
    if isinstance(value, str):
        return value.replace("{{unique}}", unique).replace("{{workdir}}", str(workdir))
    return value


class TestContract({cls}):
    backend_name = {name!r}

    def backend_options(self, workdir, unique):
        return {{k: _substitute(v, workdir, unique) for k, v in _OPTIONS.items()}}
'''


def _without_none(value: Any) -> Any:
    """TOML has no null: drop unset keys from the printed configuration."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    return value


@click.command()
@click.option(
    "--data-dir", type=click.Path(file_okay=False), help="Data folder (embedded backends)."
)
@click.option("--port", type=click.IntRange(0, 65535), help="Port of the first broker.")
@click.option(
    "--brokers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Broker processes to run (one per core is a good start).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Port of the first broker's /metrics, /livez and /readyz (0: free ports).",
)
@click.option(
    "--schema-registry-port",
    type=click.IntRange(0, 65535),
    help="Port of the first broker's schema registry (0: free ports).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    data_dir: str | None,
    port: int | None,
    brokers: int,
    metrics_port: int | None,
    schema_registry_port: int | None,
) -> int:
    """Run Kafka-compatible brokers (on the embedded default unless configured otherwise)."""
    from icefloe.broker.event_loop import event_loop_factory
    from icefloe.broker.memory import client_data_bytes
    from icefloe.broker.serve import serve as run

    overrides: dict[str, Any] = {}
    if data_dir is not None:
        overrides["data_dir"] = data_dir
    if port is not None:
        overrides["broker"] = {"port": port}
    if metrics_port is not None:
        overrides["metrics"] = {"port": metrics_port}
    if schema_registry_port is not None:
        overrides["schema_registry"] = {"port": schema_registry_port}
    config = configuration.load_config(ctx.obj.get("config_path"), overrides=overrides)
    for needed in (MetadataStore, ObjectStore, WAL):
        configuration.resolve_one(config, needed)  # fail now, with the fix, not in a child
    client_data_bytes(config.broker, config.storage)  # the memory budget must fit its parts
    event_loop_factory(config.broker.event_loop)  # uvloop, if chosen, must be installed
    return run(config, brokers)
