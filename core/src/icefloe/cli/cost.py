"""``icefloe cost``: what the cluster's object-store requests, traffic and storage cost.

The counters come from every registered broker's ``/metrics`` (or the URLs given); what is
stored comes from listing the object store. Figures are since the brokers started, or over a
window measured now, with a chart of the request cost per GB over the window.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Final

import click

from icefloe.cli import data_dir
from icefloe.cli.cost_report import Counters, Report, Stored, chart, render
from icefloe.cli.data_dir import data_dir_option
from icefloe.config.loading import LOCAL_WAL, OBJECT_WAL
from icefloe.errors import IcefloeError

if TYPE_CHECKING:
    from icefloe.config import Config
    from icefloe.storage.engine import StreamStorage

SCRAPE_TIMEOUT_S: Final = 10.0


@click.command("cost")
@data_dir_option
@click.option(
    "--window",
    type=click.FloatRange(min=1),
    help="Measure over the next SECONDS (default: since the brokers started).",
)
@click.option(
    "--every",
    type=click.FloatRange(min=0.5),
    default=5.0,
    show_default=True,
    help="With --window: read the counters every SECONDS for the chart.",
)
@click.option(
    "--metrics-url",
    "urls",
    multiple=True,
    help="A broker's /metrics URL (repeatable); default: every registered broker's.",
)
@click.option("--no-storage", is_flag=True, help="Do not list the object store.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def cost(
    ctx: click.Context,
    window: float | None,
    every: float,
    urls: tuple[str, ...],
    no_storage: bool,
    as_json: bool,
) -> None:
    """Requests, bytes and dollars per GB ingested, at the prices of [cost]."""
    from icefloe.storage.engine import StreamStorage

    config = data_dir.load(ctx)

    async def main() -> None:
        storage = await StreamStorage.open(config)
        try:
            await _report(config, storage, list(urls), window, every, no_storage, as_json)
        finally:
            await storage.close()

    asyncio.run(main())


async def _report(
    config: Config,
    storage: StreamStorage,
    urls: list[str],
    window: float | None,
    every: float,
    no_storage: bool,
    as_json: bool,
) -> None:
    urls = urls or await _registered_urls(storage, config.metrics.scheme)
    if not urls:
        raise IcefloeError(
            "no running broker serves metrics: start `icefloe serve` here (with [metrics] "
            "enabled, the default), or pass --metrics-url"
        )
    first = await _read(urls)
    points: list[tuple[float, float]] = []
    latest = first
    if window is not None:
        deadline = time.time() + window
        while (left := deadline - time.time()) > 0:
            await asyncio.sleep(min(every, left))
            latest = await _read(urls)
            dollars = _requests_per_gb(config, latest.since(first))
            if dollars is not None:
                points.append((latest.taken_at - first.taken_at, dollars))
    counters = latest.since(first if window is not None else None)
    stored = None if no_storage else await _stored(config, storage)
    profile = storage.flush_profile
    report = Report(counters, stored, config.cost, profile)
    if as_json:
        document = report.as_json()
        document["chart"] = points
        click.echo(json.dumps(document, indent=2))
        return
    title = f"over {window:.0f} s" if window is not None else "since the brokers started"
    for line in render(report, title):
        click.echo(line)
    if points:
        click.echo("")
        click.echo("request $ per GB ingested over the window:")
        for line in chart(points):
            click.echo(line)


def _requests_per_gb(config: Config, counters: Counters) -> float | None:
    report = Report(counters, None, config.cost, None)
    return report.dollars_per_gb()["requests"]


async def _registered_urls(storage: StreamStorage, scheme: str) -> list[str]:
    from icefloe.cluster import registered_brokers

    return [
        f"{scheme}://{b.host}:{b.metrics_port}/metrics"
        for b in sorted(await registered_brokers(storage.metadata), key=lambda b: b.node_id)
        if b.metrics_port is not None
    ]


async def _read(urls: list[str]) -> Counters:
    """Every broker's counters, summed; a broker that does not answer is named and skipped."""
    counters = Counters(taken_at=time.time())
    pages = await asyncio.gather(*(asyncio.to_thread(_scrape, url) for url in urls))
    for url, page in zip(urls, pages, strict=True):
        if isinstance(page, str):
            counters.add_scrape(page)
        else:
            click.echo(
                f"warning: {url} did not answer ({page}); its counters are left out", err=True
            )
    if counters.brokers == 0:
        raise IcefloeError(f"no broker answered at {', '.join(urls)}: are they running?")
    return counters


def _scrape(url: str) -> str | Exception:
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            return str(response.read().decode())
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return exc


async def _stored(config: Config, storage: StreamStorage) -> Stored:
    """What is stored now: the WAL's objects as the WAL lists them, the rest as the object
    store does."""
    wal_prefix = str(config.wal.options_for(OBJECT_WAL).get("prefix", "wal")) + "/"
    # Both list the object WAL's objects in the store (the local WAL those it left there).
    listed_by_the_wal = config.wal.backend in (OBJECT_WAL, LOCAL_WAL)
    stored = Stored()
    async for info in storage.object_store.list():  # one object at a time: any bucket size
        if not (listed_by_the_wal and info.key.startswith(wal_prefix)):
            stored = stored.plus(info.key, info.size, wal_prefix)
    async for wal_object in storage.wal.list():
        stored = stored.plus_wal(wal_object.size)
    return stored
